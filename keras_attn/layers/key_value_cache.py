"""The key/value cache of `MultiHeadAttention` for incremental decoding.

A cache `(batch, 2, max_len, kv_heads, key_dim)` holds projected keys (`cache[:, 0]`) and values
(`cache[:, 1]`). A call with `cache_update_index = t` projects its `n` new tokens, writes them at
positions `t .. t + n - 1` in one write (`written`; checked to fit, `_check_cache_bounds`: XLA's
update would silently clamp the index) and attends over the whole cache; without an index the cache is precomputed
keys/values (cross-attention to an encoder projected once). With `sliding_window=W`, a cache of
`W` slots is a ring buffer instead, written and read by `keras_attn.layers.window_cache`.
"""

import tensorflow as tf
from keras import ops

from keras_attn.core.masks import merge_masks
from keras_attn.layers import window_cache
from keras_attn.layers.projections import project
from keras_attn.utils import asserted
from keras_attn.utils import compiled_by_xla
from keras_attn.utils import nan_unless
from keras_attn.validation import check_position
from keras_attn.validation import check_positive_int


def initial_cache(layer, batch_size, max_length):
    """The body of `MultiHeadAttention.initial_cache`: an all-zero cache in the layer's compute dtype."""
    for name, size in (("batch_size", batch_size), ("max_length", max_length)):
        if not ops.is_tensor(size):
            check_positive_int(name, size)
    length = window_cache.cache_length(layer.sliding_window, max_length)
    return ops.zeros((batch_size, 2, length, layer.num_key_value_heads, layer.key_dim), layer.compute_dtype)


def padding_masks(layer, query, query_mask, value_mask, key_mask, use_causal_mask, cache, cache_update_index):
    """A call's padding masks over what it attends: with a ring buffer, key masks over its slots then
    the new tokens (the call must be causal); with a full-length cache, the query mask's rows of `query`."""
    if cache is not None and window_cache.is_window_cache(layer.sliding_window, cache, cache_update_index):
        window_cache.check_causal(use_causal_mask, layer.sliding_window, cache)  # the new tokens are keys too
        value_mask, key_mask = (
            window_cache.extend_key_mask(name, padding, layer.sliding_window, ops.shape(query)[1])
            for name, padding in (("value_mask", value_mask), ("key_mask", key_mask))
        )
    elif cache_update_index is not None and query_mask is not None:
        query_mask = query_rows(query_mask, query, cache_update_index)
    return query_mask, value_mask, key_mask


def projected(layer, query, key, value, cache, cache_update_index):
    """`(projected_query, keys, values, cache)`: the call's own projections without a cache (`cache`
    stays `None`), else the cache's keys and values, with the new tokens written when
    `cache_update_index` is given."""
    if cache is None:
        if cache_update_index is not None:
            raise ValueError(
                f"`cache_update_index` needs a `cache`. Received: cache=None, cache_update_index={cache_update_index}"
            )
        return (*project(layer, query, key, value), None)
    return _updated(layer, cache, query, key, value, cache_update_index)


def attention_options(layer, mask, attention_bias, use_causal_mask, ring, cache_update_index, query_len, key_len):
    """The mask, bias and positional keyword arguments of `scaled_dot_product_attention` for a call:
    the layer's pattern, window and position bias with the queries at `cache_update_index` (0
    without); with a ring buffer (`ring`) they are at the keys' true positions, in the mask and bias.
    A call writing into a full-length cache that is not causal attends over the keys written so far."""
    offset = 0 if cache_update_index is None else cache_update_index
    if not ring and not isinstance(offset, int) and compiled_by_xla():  # where `_updated` wrote, as XLA clamps
        offset = clamped_index(offset, query_len, key_len)
    if ring:
        mask, bias = window_cache.mask_and_bias(layer, mask, attention_bias, use_causal_mask, offset, query_len)
        return dict(
            mask=mask, bias=bias, is_causal=False, sliding_window=None, pattern=None, query_offset=0, position_bias=None
        )
    if cache_update_index is not None and not use_causal_mask:  # a causal mask already stops at the new tokens
        mask = merge_masks(mask, written_keys(cache_update_index, query_len, key_len))
    return dict(
        mask=mask,
        bias=attention_bias,
        is_causal=bool(use_causal_mask),  # Keras takes any truthy value
        sliding_window=layer.sliding_window,
        pattern=layer.attention_pattern,
        query_offset=offset,
        position_bias=layer.position_bias,
    )


def written_keys(cache_update_index, query_len, key_len):
    """Boolean `(1, 1, 1, key_len)`: `True` for the cache slots written so far, the positions before
    `cache_update_index + query_len`; the slots after them still hold the initial zeros, keys that
    would take weight from every query of a call that is not causal."""
    end = ops.cast(cache_update_index, "int32") + ops.cast(query_len, "int32")
    return ops.reshape(ops.arange(key_len, dtype="int32") < end, (1, 1, 1, -1))


def _updated(layer, cache, query, key, value, cache_update_index):
    """`projected` with a cache."""
    _check_cache(layer, cache, query)
    if cache_update_index is None:
        projected_query = layer._query_dense(query)
    else:
        projected_query, new_key, new_value = project(layer, query, key, value)
        new_entries = ops.stack((new_key, new_value), axis=1)  # (batch, 2, query_len, kv_heads, dim)
        if window_cache.is_window_cache(layer.sliding_window, cache, cache_update_index):
            check_position("cache_update_index", cache_update_index)  # a ring buffer has no end
            entries = window_cache.attended(cache, new_entries)  # (batch, 2, window + query_len, kv_heads, dim)
            cache = window_cache.written(entries, cache.shape[2], cache_update_index)
            return projected_query, entries[:, 0], entries[:, 1], cache
        fits = _check_cache_bounds(cache_update_index, ops.shape(new_key)[1], ops.shape(cache)[2])
        new_entries = ops.cast(new_entries, cache.dtype)
        if fits is not None:
            new_len, max_len = ops.shape(new_key)[1], ops.shape(cache)[2]
            index = ops.cast(cache_update_index, "int32")
            cache_update_index = asserted(fits, index, _bounds_message(index, new_len, max_len))
            new_entries, cache_update_index = _kept_unless(fits, new_entries, cache, cache_update_index)
            projected_query = nan_unless(fits, projected_query)
        cache = written(cache, new_entries, cache_update_index)
    return (projected_query, *keys_and_values(cache), cache)


def keys_and_values(cache):
    """`cache[:, 0], cache[:, 1]`: `(batch, max_len, kv_heads, dim)` each. With a batch of one known
    now, slices of the first axis of the cache without it, which TensorFlow's runtime hands out as
    views of the cache's buffer (slicing the second axis copies it)."""
    if cache.shape[0] == 1:
        pair = ops.reshape(cache, ops.shape(cache)[1:])  # (2, max_len, kv_heads, dim)
        return ops.expand_dims(pair[0], 0), ops.expand_dims(pair[1], 0)
    return cache[:, 0], cache[:, 1]


def written(cache, new_entries, index):
    """`cache` with `new_entries (batch, 2, n, kv_heads, dim)` at positions `index .. index + n - 1`, in
    one write; the cache is never re-assembled from K and V.

    Under XLA a dynamic-update-slice (`ops.slice_update`), which XLA does in place. TensorFlow's
    runtime copies the whole cache for it on every step; it does a scatter in place when nothing
    else holds the cache (a generation loop's state), so outside XLA the write is one."""
    if compiled_by_xla():
        return ops.slice_update(cache, (0, 0, index, 0, 0), new_entries)
    batch, _, new_len = ops.shape(new_entries)[:3]
    grid = (batch, 2, new_len)
    indices = tf.stack(
        [
            tf.broadcast_to(tf.reshape(tf.range(batch), (-1, 1, 1)), grid),
            tf.broadcast_to(tf.reshape(tf.range(2), (1, 2, 1)), grid),
            tf.broadcast_to(tf.cast(index, "int32") + tf.range(new_len), grid),
        ],
        axis=-1,
    )  # (batch, 2, n, 3): the (row, key or value, position) of each new entry
    return tf.tensor_scatter_nd_update(cache, indices, new_entries)


def _check_cache(layer, cache, query):
    """ValueError unless `cache` is a `(batch, 2, max_len, kv_heads, key_dim)` cache for `query` and the layer."""
    expected = (2, layer.num_key_value_heads, layer.key_dim)
    if len(cache.shape) != 5 or (cache.shape[1], cache.shape[3], cache.shape[4]) != expected:
        raise ValueError(
            f"`cache` must have shape (batch, 2, max_len, {layer.num_key_value_heads}, "
            f"{layer.key_dim}). Received: cache.shape={tuple(cache.shape)}"
        )
    if layer.key_dim != layer.value_dim:
        raise ValueError(
            "A key/value cache needs `key_dim == value_dim`. Received: "
            f"key_dim={layer.key_dim}, value_dim={layer.value_dim}"
        )
    if cache.shape[0] is not None and query.shape[0] is not None and cache.shape[0] != query.shape[0]:
        raise ValueError(
            "`cache` must have the batch size of `query`. "
            f"Received: cache.shape={tuple(cache.shape)}, query.shape={tuple(query.shape)}"
        )


def _check_cache_bounds(cache_update_index, new_len, max_len):
    """Whether the `new_len` new tokens fit in the `max_len` cache at `cache_update_index`: a
    ValueError when everything is known now (then `None`), else a scalar bool tensor for the check
    at run time (XLA's dynamic-update-slice would silently clamp the index and overwrite the last
    slots, a scatter on a GPU skip the write). Outside XLA the call asserts it (`asserted`: an
    `InvalidArgumentError`); under XLA, which drops assertions, an out-of-range step writes nothing
    and outputs NaN (`_kept_unless`, `nan_unless`)."""
    if not isinstance(cache_update_index, int):  # a float would be truncated; ints get the bounds below
        check_position("cache_update_index", cache_update_index)
    known = all(isinstance(v, int) for v in (cache_update_index, new_len, max_len))
    if known:
        if isinstance(cache_update_index, bool) or not 0 <= cache_update_index <= max_len - new_len:
            raise ValueError(
                f"`cache_update_index` must be in [0, {max_len - new_len}] for {new_len} new tokens in a cache "
                f"of length {max_len}. Received: cache_update_index={cache_update_index!r}"
            )
        return None
    index = ops.cast(cache_update_index, "int32")
    return ops.logical_and(index >= 0, index + ops.cast(new_len, "int32") <= ops.cast(max_len, "int32"))


def _bounds_message(index, new_len, max_len):
    """The run-time assertion's message for an out-of-range `cache_update_index`."""
    return [
        "`cache_update_index` out of the cache: cache_update_index=",
        index,
        "new tokens:",
        new_len,
        "cache length:",
        max_len,
    ]


def _kept_unless(fits, new_entries, cache, index):
    """`(new_entries, index)`, or under XLA when they do not `fit`, the slots at `index` clamped
    into the cache as they are, to be written back there: the cache does not change."""
    if not compiled_by_xla():
        return new_entries, index
    index = clamped_index(index, ops.shape(new_entries)[2], ops.shape(cache)[2])
    kept = ops.slice(cache, (0, 0, index, 0, 0), ops.shape(new_entries))
    return ops.where(fits, new_entries, kept), index


def clamped_index(index, new_len, max_len):
    """`index` clamped into `[0, max_len - new_len]`, as XLA's dynamic slices clamp it: under XLA an
    out-of-range step's queries sit where its (skipped) write would land, so they see keys and
    their NaN query (`nan_unless`) reaches the output."""
    return ops.clip(ops.cast(index, "int32"), 0, ops.maximum(ops.cast(max_len - new_len, "int32"), 0))


def query_rows(query_mask, query, cache_update_index):
    """The rows of a `(batch, max_len)` query mask over the cache that belong to `query`."""
    if query_mask.shape[1] is not None and query_mask.shape[1] == query.shape[1]:
        return query_mask  # already over the queries (e.g. the Keras mask of `query`)
    # Decided at run time when a length is unknown statically (e.g. inside a `while_loop`); a
    # mask as long as the queries is over the queries (over the cache it would need index 0).
    query_len = ops.shape(query)[1]
    over_queries = ops.equal(ops.shape(query_mask)[1], query_len)
    start = ops.where(over_queries, 0, ops.cast(cache_update_index, "int32"))
    return ops.slice(query_mask, (0, start), (ops.shape(query_mask)[0], query_len))


def key_length(sliding_window, cache, cache_update_index, query_len):
    """The static number of keys a cached call attends over: the cache's length, plus the new tokens
    for a ring buffer (`None` when `query_len` is)."""
    if window_cache.is_window_cache(sliding_window, cache, cache_update_index):
        return None if query_len is None else cache.shape[2] + query_len  # the slots, then the new tokens
    return cache.shape[2]
