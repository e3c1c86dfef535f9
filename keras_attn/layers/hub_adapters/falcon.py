"""The adapter of KerasHub's Falcon attention: its `call(inputs, alibi, attention_mask, cache, cache_update_index)`.

Falcon's decoder block builds the ALiBi bias `(batch, heads, 1, key_len)` (each head's slope times
each key's position among the real tokens) and hands it to the attention, which adds it to the
logits before scaling them: `softmax((Q K^T + alibi) / sqrt(head_dim))`. On the core op that is
`scale = 1 / sqrt(head_dim)` and the additive `bias = alibi / sqrt(head_dim)`, broadcast over the
queries (never a `(query_len, key_len)` tensor). The rest of the call is KerasHub's
(`cached_projections`). Attention dropout runs in KerasHub's call without a `training` argument
(Keras's call context decides): a layer built with it is not adapted.
"""

from keras import ops

from keras_attn.layers.hub_adapters.cached_projections import cached_attention_call

HOOK = "call"


def compute_attention(layer, inputs, alibi, attention_mask=None, cache=None, cache_update_index=None):
    """Falcon's attention `call`, its attention on `scaled_dot_product_attention`."""
    projections = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
    scaled_alibi = alibi * ops.cast(layer.inv_norm_factor, layer.compute_dtype)
    return cached_attention_call(
        layer, inputs, projections, lambda key_len: scaled_alibi, attention_mask, cache, cache_update_index
    )


def why_unsupported(layer):
    """`None`, or why this layer's attention cannot run on the core op (attention dropout)."""
    if layer.attention_dropout_rate:
        return (
            f"Falcon's attention dropout (attention_dropout_rate={layer.attention_dropout_rate}) runs without a "
            "`training` argument in KerasHub's call, so the adapter cannot tell when it is on"
        )
    return None
