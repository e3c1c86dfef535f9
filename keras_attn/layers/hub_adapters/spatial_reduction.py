"""The adapter of KerasHub's MiT (SegFormer) attention, `SegFormerMultiheadAttention`: its `call(x)`.

SegFormer's efficient attention has no hook: its `call` takes the tokens of a square `H x W` grid,
projects the queries, and, with `sr_ratio > 1`, reduces the grid for the keys and values (a
strided convolution `sr`, then `norm`) before projecting them; it scales the logits by `scale`
and drops out the weights with its dropout layer, which it calls without `training` (Keras's call
context decides, `keras_attn.keras_internals.call_context_training`). On the core op: the queries
over the reduced keys and values, `scale`, and that dropout; the output projection and its
dropout are the layer's.
"""

import math

from keras import ops

from keras_attn.keras_internals import call_context_training
from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout

HOOK = "call"


def compute_attention(layer, x):
    """SegFormer's attention `call`, its attention on `scaled_dot_product_attention`."""
    batch, length, channels = ops.shape(x)
    side = int(math.sqrt(length))  # the grid is square, as KerasHub's call assumes

    def heads(states):  # (batch, length, channels) -> (batch, length, heads, channels / heads)
        return ops.reshape(states, (batch, -1, layer.num_heads, channels // layer.num_heads))

    query = heads(layer.q(x))
    if layer.sr_ratio > 1:
        x = layer.norm(ops.reshape(layer.sr(ops.reshape(x, (batch, side, side, channels))), (batch, -1, channels)))
    output = hub_attention(
        query,
        heads(layer.k(x)),
        heads(layer.v(x)),
        scale=layer.scale,
        **weights_dropout(layer.dropout, call_context_training()),
        implementation=layer.implementation,
    )
    return layer.proj_drop(layer.proj(ops.reshape(output, (batch, length, channels))))


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
