"""The segment-id arguments of a `MultiHeadAttention` call: packed rows, with and without a cache.

Without a cache the ids are those of `scaled_dot_product_attention` (`keras_attn.core.segments`):
`segment_ids` for self-attention, `query_segment_ids` with `key_segment_ids` for cross-attention.

A cache holds projected keys and values only (its layout is KerasHub's, shared with generation
loops that know nothing of documents), so the ids of the tokens it holds are a record beside it,
`(batch, cache_len)` int, kept by the caller: all zeros with an empty cache (a slot never written is
padding, attended by no query), then after each step `next_cache_segment_ids(...)`, the record
with the step's ids written where the step writes its keys. A step takes `query_segment_ids`
(its new tokens' documents) and `key_segment_ids` (the record as received, before the step); its
keys are the record with the new ids written (a full-length cache) or the record's slots followed
by the new ids (a ring buffer, `keras_attn.layers.window_cache`). A precomputed cache
(cross-attention, no `cache_update_index`) takes `key_segment_ids` over its keys as they are.
"""

from keras import ops

from keras_attn.core.segments import resolve_segment_ids
from keras_attn.core.segments import segment_mask
from keras_attn.layers import window_cache


def first_given(segment_ids, query_segment_ids, key_segment_ids):
    """The first segment-id argument given, or `None`: what a family without `segments` refuses."""
    return next((ids for ids in (segment_ids, query_segment_ids, key_segment_ids) if ids is not None), None)


def call_segment_ids(layer, query, key, segment_ids, query_segment_ids, key_segment_ids, cache, cache_update_index):
    """`(query_ids, key_ids)`, int32 `(batch, query_len)` and `(batch, attended keys)`, or `(None, None)`.

    The key ids are over the keys the call attends: `key`'s tokens, a precomputed cache's slots, or
    the keys of a cached step (see the module docstring).
    """
    if cache is None or cache_update_index is None:
        key_len = key.shape[1] if cache is None else cache.shape[2]
        query_ids, key_ids = resolve_segment_ids(
            segment_ids, query_segment_ids, key_segment_ids, query.shape[1], key_len, query.shape[0]
        )
        # The one tensor for both roles: `rows_in_documents` then knows a real query sees itself.
        return (query_ids, query_ids) if segment_ids is not None else (query_ids, key_ids)
    if segment_ids is not None:
        raise ValueError(
            "A cached step attends over the cache, not over its own tokens: pass `query_segment_ids` (the new "
            "tokens' documents) and `key_segment_ids` (those of the tokens the cache holds, as received), not "
            f"`segment_ids`. Received: segment_ids.shape={tuple(segment_ids.shape)}, cache.shape={tuple(cache.shape)}"
        )
    query_ids, record = resolve_segment_ids(
        None, query_segment_ids, key_segment_ids, query.shape[1], cache.shape[2], query.shape[0]
    )
    if query_ids is None:
        return None, None
    if window_cache.is_window_cache(layer.sliding_window, cache, cache_update_index):
        return query_ids, ops.concatenate([record, query_ids], axis=1)  # the slots, then the new tokens
    return query_ids, _written(record, query_ids, cache_update_index)


def next_cache_segment_ids(layer, cache, key_segment_ids, query_segment_ids, cache_update_index):
    """The record of the cache's ids after a step (see the module docstring): `(batch, cache_len)` int32."""
    query_ids, record = resolve_segment_ids(
        None, query_segment_ids, key_segment_ids, query_segment_ids.shape[1], cache.shape[2]
    )
    if window_cache.is_window_cache(layer.sliding_window, cache, cache_update_index):
        entries = ops.concatenate([record, query_ids], axis=1)  # as `window_cache.attended` lays out the keys
        return window_cache.written(entries, cache.shape[2], cache_update_index, axis=1)
    return _written(record, query_ids, cache_update_index)


def real_tokens(segment_ids):
    """`(batch, seq)` bool, the tokens of a document (id not 0): what is not padding; `None` without ids."""
    return None if segment_ids is None else ops.not_equal(segment_ids, 0)


def _written(record, new_ids, index):
    """`record` `(batch, max_len)` with `new_ids` `(batch, n)` at `index .. index + n - 1`: a selection
    (elementwise, so it runs under XLA and in ONNX whatever the index)."""
    positions = ops.arange(ops.shape(record)[1], dtype="int32") - ops.cast(index, "int32")  # (max_len,)
    new_len = ops.shape(new_ids)[1]
    inside = ops.logical_and(positions >= 0, positions < new_len)
    taken = ops.take(new_ids, ops.clip(positions, 0, new_len - 1), axis=1)  # (batch, max_len)
    return ops.where(inside[None, :], taken, record)


def rows_in_documents(mask, query_ids, key_ids):
    """`(batch, query_len)`: whether each query sees a key of its own document through `mask`
    (`None`: every key); `None` without ids. A padding query (id 0) sees none; in self-attention
    (the same ids tensor) a real query sees itself, so only a mask can leave it without keys."""
    if query_ids is None:
        return None
    if mask is None and query_ids is key_ids:
        return ops.not_equal(query_ids, 0)
    allowed = segment_mask(query_ids, key_ids)
    if mask is not None:
        allowed = ops.logical_and(allowed, ops.cast(mask, "bool"))
    return ops.any(allowed, axis=(1, 3))
