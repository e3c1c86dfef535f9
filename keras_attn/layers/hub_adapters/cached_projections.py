"""What the `call` of KerasHub's Falcon and Bloom attention does around its attention, for their adapters.

Those layers have no `_compute_attention` hook: their adapters replace `call`, and this module is
the part of it that is theirs, as KerasHub writes it: the query, key and value projections of
`(batch, length, heads, head_dim)` and the key/value cache `(batch, 2, max_length, heads,
head_dim)`, written at `cache_update_index` (or read whole when no index is given).
"""

from keras import ops


def project_and_cache(inputs, dense_layers, cache=None, cache_update_index=None):
    """`(query, key, value, cache)`: the projections of `inputs` by `dense_layers` (query, key, value), the cache updated."""
    query_dense, key_dense, value_dense = dense_layers
    query, key, value = query_dense(inputs), key_dense(inputs), value_dense(inputs)
    if cache is None:
        if cache_update_index is not None:
            raise ValueError(
                "`cache_update_index` should not be set if `cache` is `None`. "
                f"Received: cache={cache}, cache_update_index={cache_update_index}"
            )
        return query, key, value, None
    key_cache, value_cache = cache[:, 0, ...], cache[:, 1, ...]
    if cache_update_index is None:
        return query, key_cache, value_cache, cache
    start = [0, cache_update_index, 0, 0]
    key = ops.slice_update(key_cache, start, key)
    value = ops.slice_update(value_cache, start, value)
    return query, key, value, ops.stack((key, value), axis=1)


def heads_merged(output):
    """`(batch, length, heads * head_dim)` of an attention output `(batch, length, heads, head_dim)`."""
    batch, length, heads, head_dim = ops.shape(output)
    return ops.reshape(output, (batch, length, heads * head_dim))
