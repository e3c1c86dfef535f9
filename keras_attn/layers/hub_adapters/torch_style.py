"""The adapter of KerasHub's Flux attention, `FluxRoPEAttention`: its `call`, with its module's attention function routed.

The layer has no hook: its `call` applies the rotary embedding and calls the function
`scaled_dot_product_attention` of its own module (`flux_maths`), written after PyTorch's
(`(batch, heads, length, depth)` in and out, `attn_mask`, `dropout_p`, `is_causal`, `scale`).
The adapted `call` is the layer's own, run while that module's function is one that computes
with `keras_attn.scaled_dot_product_attention` (`keras_attn.layers.hub_adapters.routing`): a
boolean `attn_mask` is the mask, a float one the additive bias, as PyTorch's. The function
drops out the weights with a new dropout layer at every call, always in training mode: a layer
built with `dropout_p > 0` is not adapted.
"""

import sys

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.routing import routed

HOOK = "call"
_FUNCTION = "scaled_dot_product_attention"  # the name the layer's module calls


def compute_attention(layer, *args, **kwargs):
    """The layer's own `call`, its module's attention function computed by keras_attn's op."""
    module = sys.modules[type(layer).__mro__[1].__module__]  # the KerasHub class's module

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        del dropout_p  # 0: `why_unsupported` names the layers with dropout
        boolean = attn_mask is not None and attn_mask.dtype == "bool"
        output = hub_attention(
            *(ops.transpose(tensor, (0, 2, 1, 3)) for tensor in (query, key, value)),
            mask=attn_mask if boolean else None,
            bias=None if boolean else attn_mask,
            is_causal=is_causal,
            scale=scale,
            implementation=layer.implementation,
        )
        return ops.transpose(output, (0, 2, 1, 3))

    with routed(module, _FUNCTION, attention):
        return super(type(layer), layer).call(*args, **kwargs)


def why_unsupported(layer):
    """`None`, or why this layer's attention cannot run on the core op (its always-on dropout)."""
    if layer.dropout_p:
        return (
            f"Flux's attention dropout (dropout_p={layer.dropout_p}) runs in training mode at every call, "
            "inference included; the adapter keeps no such dropout"
        )
    return None
