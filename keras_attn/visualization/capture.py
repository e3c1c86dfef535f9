"""Record the attention weights every keras_attn attention layer computes during a forward pass.

No model is rebuilt: while an `AttentionCapture` is open, each attention layer found in the model
whose family declares `capabilities.scores` (every family: `MultiHeadAttention` and its named uses,
`LSHSelfAttention`, `LinformerSelfAttention`, `LinearAttention`, and the attention inside the encoder
and decoder blocks) is asked for its weights on every call (`return_attention_scores=True`, the one
call convention), which are recorded under the layer's path and stripped from what the caller
receives. Functional, sequential and subclassed models work alike, as long as they run eagerly.
"""

import numpy as np

from keras_attn.keras_internals import layer_tree
from keras_attn.layers.capabilities import AttentionCapabilities


def _returns_scores(layer):
    capabilities = getattr(type(layer), "capabilities", None)
    return isinstance(capabilities, AttentionCapabilities) and capabilities.scores


def attention_layers(model):
    """The keras_attn attention layers inside `model` (itself included), outermost first."""
    if _returns_scores(model):
        return [model]
    return [layer for layer in layer_tree(model) if _returns_scores(layer)]


def _layer_key(layer):
    return layer.path or layer.name


class AttentionCapture:
    """Context manager recording `{layer path: [weights of each call]}` for a model's attention layers.

    Example:

    >>> import keras, numpy as np, keras_attn
    >>> inputs = keras.Input((None, 8))
    >>> model = keras.Model(inputs, keras_attn.SelfAttention(num_heads=2, key_dim=4, name="attn")(inputs))
    >>> with AttentionCapture(model) as capture:
    ...     _ = model(np.ones((1, 3, 8), "float32"))
    >>> capture.weights["attn"][0].shape
    (1, 2, 3, 3)
    """

    def __init__(self, model):
        self.layers = attention_layers(model)
        if not self.layers:
            raise ValueError(
                "`model` holds no keras_attn attention layer (one whose class declares `capabilities` with "
                f"scores=True, as every family does). Received: model={getattr(model, 'name', model)!r} of type {type(model).__name__}"
            )
        self.weights = {}
        self._replaced = {}

    def __enter__(self):
        self.weights = {}
        for layer in self.layers:
            self._replaced[id(layer)] = layer.__dict__.get("call")
            layer.__dict__["call"] = self._recording_call(layer, layer.call)
        return self

    def __exit__(self, *exc_info):
        for layer in self.layers:
            replaced = self._replaced.pop(id(layer))
            if replaced is None:
                del layer.__dict__["call"]
            else:
                layer.__dict__["call"] = replaced
        return False

    def _recording_call(self, layer, original_call):
        key = _layer_key(layer)

        def call(*args, return_attention_scores=False, **kwargs):
            results = original_call(*args, return_attention_scores=True, **kwargs)
            weights = results[1]  # (batch, heads, query_len, key_len); key_len is projected_length for Linformer
            if not hasattr(weights, "numpy"):
                raise RuntimeError(
                    f"Attention weights of layer {key!r} are symbolic: run the model eagerly "
                    "(`model(inputs)`, not `model.predict` or a `tf.function`) inside AttentionCapture."
                )
            self.weights.setdefault(key, []).append(np.asarray(weights.numpy(), np.float32))
            if return_attention_scores:
                return results
            rest = results[:1] + results[2:]
            return rest[0] if len(rest) == 1 else rest

        return call


def attention_weights(model, inputs, **call_kwargs):
    """The attention weights of every keras_attn attention layer of `model` for `inputs`.

    Runs `model(inputs, training=False, **call_kwargs)` once, eagerly.

    Args:
        model: a Keras model or layer holding keras_attn attention layers (at any depth).
        inputs: what `model` takes.
        **call_kwargs: more arguments for the call.

    Returns:
        A dict `{layer path: float32 array (batch, heads, query_len, key_len)}` in call order.
        A layer called more than once in the pass gets `path`, `path#2`, `path#3`, ...
    """
    with AttentionCapture(model) as capture:
        model(inputs, training=False, **call_kwargs)
    collected = {}
    for key, calls in capture.weights.items():
        for index, weights in enumerate(calls):
            collected[key if index == 0 else f"{key}#{index + 1}"] = weights
    return collected
