"""The parts of Keras that are not public API which keras_attn needs, in one place.

`sublayers(layer)` is what Keras itself walks to find a layer's weights (`Layer._flatten_layers`):
the layers tracked as attributes of a custom layer or a subclassed model, and the layers of a
Functional or Sequential model. Keras has no public equivalent for a layer that is not a model.
`layer_tree(layer)` is the same walk to any depth, `layer` first. `build_shapes(layer)` is the
input shapes a built layer was built for, which Keras records (`Layer._build_shapes_dict`, also on
loading from a file) and exposes no public way to read. `tensorflow_backend_nn()` is the
TensorFlow backend's `nn` module (`keras.src`), whose `dot_product_attention` Keras's public op looks
up at each call: `keras_attn.enable()` puts ours in its place. `call_context_training()` is the
`training` flag of the Keras call in progress, which Keras hands to a sublayer called without one
(KerasHub's MiT attention calls its dropout so). `attention_takes(argument)` says whether the
installed Keras's `MultiHeadAttention` takes a constructor argument (`sliding_window` and
`use_gate` came in Keras 3.15; the supported range starts earlier).
`tests/test_keras_internals.py` checks it against the pinned Keras (and `make test-compat` against
the oldest supported one).
"""

import inspect

import keras


def sublayers(layer):
    """The layers `layer` holds directly (not itself, not their own sublayers), in tracking order."""
    return layer._flatten_layers(include_self=False, recursive=False)


def layer_tree(layer):
    """`layer` and every layer it holds, to any depth, each once."""
    return layer._flatten_layers(include_self=True, recursive=True)


def build_shapes(layer):
    """`{argument}_shape: shape` of the inputs `layer` was built for, or `None` when not built."""
    return getattr(layer, "_build_shapes_dict", None) if layer.built else None


def tensorflow_backend_nn():
    """The backend's `nn` module (TensorFlow's, under that backend), whose `dot_product_attention`
    `keras.ops.dot_product_attention` looks up at each call."""
    from keras.src import backend

    return backend.nn


def call_context_training():
    """The `training` flag of the Keras call in progress (`None` outside a call, or when none was given)."""
    from keras.src.backend.common import global_state

    context = global_state.get_global_attribute("current_call_ctx")
    return None if context is None else context.training


def attention_takes(argument):
    """Whether `keras.layers.MultiHeadAttention`'s constructor takes `argument` (`sliding_window` and
    `use_gate`: from Keras 3.15 on)."""
    return argument in inspect.signature(keras.layers.MultiHeadAttention.__init__).parameters


def newer_attention_arguments(**arguments):
    """The `arguments` that `keras.layers.MultiHeadAttention`'s constructor takes, as `{name: value}`:
    an older Keras refuses `sliding_window` and `use_gate`, which `keras_attn.MultiHeadAttention`
    then keeps itself (in the attributes Keras 3.15 uses)."""
    return {name: value for name, value in arguments.items() if attention_takes(name)}
