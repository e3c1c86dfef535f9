"""The adapter of KerasHub's Swin Transformer attention, `WindowAttention`: its `call(x, mask, return_attns)`.

The layer has no hook: its `call` attends within each window (`(num_windows * batch, window
tokens, channels)`), projects with one `qkv` layer, scales the queries by `scale`, adds its
learned relative position bias (`_get_rel_pos_bias()`, `(heads, N, N)`) and, for the shifted
windows, the additive mask of each window (`(num_windows, N, N)`, windows in the batch's order),
drops out the weights (its dropout layer, called without `training`: Keras's call context
decides) and projects the output. On the core op: `scale` and both terms as the additive `bias`.
"""

from keras import ops

from keras_attn.keras_internals import call_context_training
from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout

HOOK = "call"


def compute_attention(layer, x, mask=None, return_attns=False):
    """The layer's `call` (and its weights, with `return_attns`), its attention on `scaled_dot_product_attention`."""
    windows, length, channels = ops.shape(x)[0], ops.shape(x)[1], ops.shape(x)[2]
    qkv = ops.reshape(layer.qkv(x), (windows, length, 3, layer.num_heads, -1))
    bias = layer._get_rel_pos_bias()[None]  # (1, heads, N, N)
    if mask is not None:  # window w of every image gets mask[w]: the batch is images x windows
        per_window = ops.tile(mask, (windows // ops.shape(mask)[0], 1, 1))
        bias = bias + ops.cast(per_window[:, None], bias.dtype)
    result = hub_attention(
        qkv[:, :, 0],
        qkv[:, :, 1],
        qkv[:, :, 2],
        bias=bias,
        scale=layer.scale,
        **weights_dropout(layer.attention_dropout_layer, call_context_training()),
        return_weights=bool(return_attns),
        implementation=layer.implementation,
    )
    output, weights = result if return_attns else (result, None)
    output = layer.proj_drop(layer.proj(ops.reshape(output, (windows, length, channels))))
    return (output, weights) if return_attns else output


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
