"""The `call` of KerasHub's Falcon and Bloom attention (and T5's cache), its attention on the core op, for their adapters.

Those layers have no `_compute_attention` hook: their adapters replace `call`, and this module is
that call as KerasHub writes it, but for the attention: the query, key and value projections of
`(batch, length, heads, head_dim)`, the key/value cache `(batch, 2, max_length, heads, head_dim)`
written at `cache_update_index` (or read whole when no index is given), the attention on
`keras_attn.scaled_dot_product_attention` with the layer's scale and an additive bias (their
ALiBi), and the output projection.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention


def cached_attention_call(layer, inputs, projections, bias, attention_mask=None, cache=None, cache_update_index=None):
    """The layer's output (and its cache, when given one).

    Args:
        layer: the adapted layer (its `inv_norm_factor` and `implementation` are read).
        inputs: `(batch, length, hidden_dim)`.
        projections: the layer's query, key, value and output dense layers, in that order.
        bias: a function of the key length: the additive bias, broadcastable to
            `(batch, heads, query_len, key_len)`.
        attention_mask: optional `(batch, query_len, key_len)` mask, `True` where a query may attend.
        cache, cache_update_index: KerasHub's cache and the index where this call writes it.
    """
    query_dense, key_dense, value_dense, output_dense = projections
    query, key, value = query_dense(inputs), key_dense(inputs), value_dense(inputs)
    key, value, cache = cached_keys_and_values(key, value, cache, cache_update_index)
    output = hub_attention(
        query,
        key,
        value,
        mask=None if attention_mask is None else ops.cast(attention_mask[:, None], "bool"),
        bias=bias(ops.shape(key)[1]),
        scale=layer.inv_norm_factor,
        implementation=layer.implementation,
    )
    batch, length, heads, head_dim = ops.shape(output)
    output = output_dense(ops.reshape(output, (batch, length, heads * head_dim)))
    return output if cache is None else (output, cache)


def cached_keys_and_values(key, value, cache, cache_update_index):
    """`(key, value, cache)`: this call's keys and values written into the cache (or the cache's, read whole)."""
    if cache is None:
        if cache_update_index is not None:
            raise ValueError(
                "`cache_update_index` should not be set if `cache` is `None`. "
                f"Received: cache={cache}, cache_update_index={cache_update_index}"
            )
        return key, value, None
    key_cache, value_cache = cache[:, 0, ...], cache[:, 1, ...]
    if cache_update_index is None:
        return key_cache, value_cache, cache
    start = [0, cache_update_index, 0, 0]
    key = ops.slice_update(key_cache, start, key)
    value = ops.slice_update(value_cache, start, value)
    return key, value, ops.stack((key, value), axis=1)
