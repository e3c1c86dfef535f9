"""The adapter of KerasHub's Bloom attention: its `call(hidden_states, attention_mask, cache, cache_update_index)`.

Bloom adds ALiBi to the scaled logits with its `AlibiBias` layer: head `h`'s slope times the key's
offset from the last key, `slope_h * (j - key_len + 1)`, the same for every query: on the core op
the additive `bias` of shape `(1, heads, 1, key_len)` (the layer's own, so its slopes), never a
`(query_len, key_len)` tensor. The rest of the call is KerasHub's (`cached_projections`). Its
dropout layer runs on the weights and on the output without a `training` argument (Keras's call
context decides): a layer built with dropout is not adapted.
"""

from keras import ops

from keras_attn.core.attention import scaled_dot_product_attention
from keras_attn.layers.hub_adapters.cached_projections import heads_merged
from keras_attn.layers.hub_adapters.cached_projections import project_and_cache

HOOK = "call"


def compute_attention(layer, hidden_states, attention_mask=None, cache=None, cache_update_index=None):
    """Bloom's attention `call`, its attention on `scaled_dot_product_attention`."""
    dense_layers = (layer._query_dense, layer._key_dense, layer._value_dense)
    query, key, value, cache = project_and_cache(hidden_states, dense_layers, cache, cache_update_index)
    # The layer's ALiBi of every key, as it adds it to the logits (of any query: it does not depend on it).
    alibi = layer._alibi_layer(ops.zeros((1, layer.num_heads, 1, ops.shape(key)[1]), layer.compute_dtype))
    output = scaled_dot_product_attention(
        query,
        key,
        value,
        mask=None if attention_mask is None else ops.cast(attention_mask[:, None], "bool"),
        bias=alibi,
        scale=layer.inv_norm_factor,
        implementation=layer.implementation,
    )
    output = layer._output_dense(heads_merged(output))
    return output if cache is None else (output, cache)


def why_unsupported(layer):
    """`None`, or why this layer's attention cannot run on the core op (dropout)."""
    if layer.dropout:
        return (
            f"Bloom's attention dropout (dropout={layer.dropout}) runs without a `training` argument in "
            "KerasHub's call, so the adapter cannot tell when it is on"
        )
    return None
