"""The adapter of KerasHub's Bloom attention: its `call(hidden_states, attention_mask, cache, cache_update_index)`.

Bloom adds ALiBi to the scaled logits with its `AlibiBias` layer: head `h`'s slope times the key's
offset from the last key, `slope_h * (j - key_len + 1)`, the same for every query: on the core op
the additive `bias` of shape `(1, heads, 1, key_len)` (the layer's own, so its slopes), never a
`(query_len, key_len)` tensor. The rest of the call is KerasHub's (`cached_projections`). Its
dropout layer runs on the weights and on the output without a `training` argument (Keras's call
context decides): a layer built with dropout is not adapted.
"""

from keras import ops

from keras_attn.layers.hub_adapters.cached_projections import cached_attention_call

HOOK = "call"


def compute_attention(layer, hidden_states, attention_mask=None, cache=None, cache_update_index=None):
    """Bloom's attention `call`, its attention on `scaled_dot_product_attention`."""
    projections = (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense)

    def alibi(key_len):  # the layer's ALiBi of every key, as it adds it to the logits of any query
        return layer._alibi_layer(ops.zeros((1, layer.num_heads, 1, key_len), layer.compute_dtype))

    return cached_attention_call(layer, hidden_states, projections, alibi, attention_mask, cache, cache_update_index)


def why_unsupported(layer):
    """`None`, or why this layer's attention cannot run on the core op (dropout)."""
    if layer.dropout:
        return (
            f"Bloom's attention dropout (dropout={layer.dropout}) runs without a `training` argument in "
            "KerasHub's call, so the adapter cannot tell when it is on"
        )
    return None
