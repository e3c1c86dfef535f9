"""The sliding-window key/value cache: a ring buffer of a window's tokens, memory constant in the position.

A causal layer with `sliding_window=W` lets position `i` see keys `i - W + 1 .. i` only, so its
decoding cache needs `W` slots whatever the position: `MultiHeadAttention.initial_cache(batch,
max_length)` gives `(batch, 2, min(W, max_length), kv_heads, key_dim)`. A cache of exactly `W`
slots is this ring buffer; the token at position `p` lives in slot `p % W`.

A step of `n` new tokens at `cache_update_index = t` attends over the `W` slots as received
(positions up to `t - 1`) followed by the `n` new tokens (positions `t .. t + n - 1`), so every
query, the first of a long prefill included, still sees each key its window holds; the mask,
the attention pattern and the position bias are computed from these true positions (a slot's
position follows from its index and `t`; a slot not written yet has a negative one and is
masked). Then the new tokens are written at `(t + j) % W` (with `n > W`, only the last `W`).
Positions below `W` fill the buffer in order, as a full-length cache would.
"""

import numbers

from keras import ops

from keras_attn import patterns
from keras_attn.core.masks import merge_masks
from keras_attn.core.position_bias import block_positions


def cache_length(sliding_window, max_length):
    """Slots a cache needs for `max_length` positions: `min(sliding_window, max_length)` with a window
    (the window when `max_length` is a tensor: the ring's length must be static)."""
    if sliding_window is None:
        return max_length
    return min(sliding_window, max_length) if isinstance(max_length, numbers.Integral) else sliding_window


def is_window_cache(sliding_window, cache, cache_update_index):
    """Whether a cached call writes into a ring buffer: a windowed layer and a cache of `sliding_window` slots."""
    shape = getattr(cache, "shape", ())  # a malformed cache is refused with the full-length cache's error
    return (
        sliding_window is not None and cache_update_index is not None and len(shape) > 2 and shape[2] == sliding_window
    )


def check_causal(use_causal_mask, sliding_window, cache):
    """A `ValueError` unless the call is causal: the buffer holds earlier tokens only."""
    if not use_causal_mask:
        raise ValueError(
            f"A cache of `sliding_window={sliding_window}` slots is a ring buffer of the earlier tokens: call the layer "
            f"with `use_causal_mask=True` (or pass a full-length cache). Received: use_causal_mask={use_causal_mask!r}, "
            f"cache.shape={tuple(cache.shape)}"
        )


def _newest_positions(last, window):
    """int32 `(window,)`: for each slot, the newest position `<= last` that lives in it (`p % window`)."""
    return last - ops.mod(last - ops.arange(window, dtype="int32"), window)


def slot_positions(cache_update_index, window):
    """int32 `(window,)`: the position each slot holds before the write at `cache_update_index`;
    negative for a slot not written yet."""
    return _newest_positions(ops.cast(cache_update_index, "int32") - 1, window)


def key_positions(cache_update_index, window, new_len):
    """int32 `(window + new_len,)`: the positions of the attended keys, the slots then the new tokens."""
    return ops.concatenate([slot_positions(cache_update_index, window), block_positions(cache_update_index, new_len)])


def attended(cache, new_entries):
    """The keys and values a step attends over: the slots as received, then the new tokens.

    Args:
        cache: `(batch, 2, window, kv_heads, key_dim)`.
        new_entries: `(batch, 2, new_len, kv_heads, key_dim)`, the projected new keys and values.

    Returns:
        `(batch, 2, window + new_len, kv_heads, key_dim)`, at `key_positions`.
    """
    return ops.concatenate([cache, ops.cast(new_entries, cache.dtype)], axis=2)


def written(entries, window, cache_update_index, axis=2):
    """The ring buffer after the step: `(batch, 2, window, ...)` from its `attended` entries (or, with
    `axis=1`, the `(batch, window)` segment ids of its slots from those of the attended keys).

    Each slot takes the newest position of its residue class: a new token's entry, else its own.
    """
    index = ops.cast(cache_update_index, "int32")
    newest = index + ops.cast(ops.shape(entries)[axis] - window, "int32") - 1  # the last new token's position
    positions = _newest_positions(newest, window)  # (window,) after the write
    source = ops.where(positions >= index, window + positions - index, ops.arange(window, dtype="int32"))
    return ops.take(entries, source, axis=axis)


def extend_key_mask(name, key_mask, window, new_len):
    """A key padding mask over the `(batch, window)` slots, extended with `True` for the new tokens."""
    if key_mask is None:
        return None
    if len(key_mask.shape) != 2 or key_mask.shape[1] not in (None, window):
        raise ValueError(
            f"`{name}` with a window cache covers its slots: shape (batch, {window}). "
            f"Received: {name}.shape={tuple(key_mask.shape)}"
        )
    new_keys = ops.ones((ops.shape(key_mask)[0], new_len), "bool")
    return ops.concatenate([ops.cast(key_mask, "bool"), new_keys], axis=1)  # (batch, window + new_len)


def position_mask(pattern, use_causal_mask, sliding_window, query_positions, keys_positions):
    """Boolean `(1, 1, query_len, key_len)`: the layer's pattern at the true positions, empty slots excluded."""
    pattern = patterns.from_shorthands(pattern, use_causal_mask, sliding_window)
    allowed = ops.logical_and(pattern.mask(query_positions, keys_positions), ops.expand_dims(keys_positions >= 0, 0))
    return allowed[None, None]


def with_position_bias(attention_bias, position_bias, query_positions, keys_positions):
    """`attention_bias` plus `position_bias`'s bias at the true positions `(1, heads, query_len, key_len)`."""
    if position_bias is None:
        return attention_bias
    bias = position_bias.block_bias(position_bias.bias_parameters(), query_positions, keys_positions)
    return bias if attention_bias is None else ops.add(ops.cast(attention_bias, bias.dtype), bias)


def mask_and_bias(layer, mask, attention_bias, use_causal_mask, cache_update_index, new_len):
    """The mask and bias of a ring-buffer step with the layer's pattern and position bias at the true positions.

    Returns:
        `(mask, bias)` for `scaled_dot_product_attention` without `is_causal`, `sliding_window`,
        `pattern`, `query_offset` or `position_bias` (they are in them).
    """
    window = layer.sliding_window
    queries = block_positions(cache_update_index, new_len)  # (new_len,)
    keys = key_positions(cache_update_index, window, new_len)  # (window + new_len,)
    mask = merge_masks(mask, position_mask(layer.attention_pattern, use_causal_mask, window, queries, keys))
    return mask, with_position_bias(attention_bias, layer.position_bias, queries, keys)
