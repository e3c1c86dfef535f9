"""Boolean attention masks: causal, sliding window, padding, and their intersection.

Every mask is `True` where a query may attend to a key and broadcasts to
`(batch, heads, query_len, key_len)`. The causal and band rules are written here once; the
dense, chunked and blockwise kernels all build their masks from these functions.
"""

from keras import ops


def causal_mask(query_len, key_len, query_offset=0):
    """Boolean lower-triangular mask, `True` where query `i` may attend to key `j <= i + offset`.

    With `query_offset=0` it is aligned at the top left, as
    `keras.layers.MultiHeadAttention(use_causal_mask=True)`: query `i` sees keys `0..i` even when
    `key_len != query_len`. In cached decoding the queries are the tokens at positions
    `query_offset, query_offset + 1, ...` of a key/value cache of length `key_len`.

    Args:
        query_len: number of queries.
        key_len: number of keys.
        query_offset: position of the first query (an int or a scalar int tensor).

    Returns:
        A boolean tensor of shape `(1, 1, query_len, key_len)`.
    """
    rows = ops.arange(query_len, dtype="int32") + ops.cast(query_offset, "int32")
    rows = ops.expand_dims(rows, -1)  # (query_len, 1)
    cols = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)  # (1, key_len)
    return ops.reshape(ops.greater_equal(rows, cols), (1, 1, query_len, key_len))


def sliding_window_mask(query_len, key_len, window, query_offset=0):
    """Boolean band mask, `True` where `|i + query_offset - j| < window` (local attention).

    The same band as `keras.layers.MultiHeadAttention(sliding_window=window)`; combined with
    `causal_mask` it gives the causal sliding window of Mistral-style models. `query_offset` is
    the position of the first query, as in `causal_mask`.

    Returns:
        A boolean tensor of shape `(1, 1, query_len, key_len)`.
    """
    rows = ops.arange(query_len, dtype="int32") + ops.cast(query_offset, "int32")
    rows = ops.expand_dims(rows, -1)  # (query_len, 1)
    cols = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)  # (1, key_len)
    band = ops.less(ops.abs(rows - cols), window)  # (query_len, key_len)
    return ops.reshape(band, (1, 1, query_len, key_len))


def merge_masks(*masks):
    """Logical AND of the masks that are not `None`; `None` when all are `None`."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def padding_mask_to_attention_mask(query_mask=None, key_mask=None):
    """Turns `(batch, query_len)` / `(batch, key_len)` padding masks into a 4-D attention mask.

    Returns:
        A boolean tensor broadcastable to `(batch, 1, query_len, key_len)`, or `None`.
    """
    rows = None if query_mask is None else ops.reshape(
        ops.cast(query_mask, "bool"), (ops.shape(query_mask)[0], 1, -1, 1)
    )  # (batch, 1, query_len, 1)
    cols = None if key_mask is None else ops.reshape(
        ops.cast(key_mask, "bool"), (ops.shape(key_mask)[0], 1, 1, -1)
    )  # (batch, 1, 1, key_len)
    return merge_masks(rows, cols)


def banded_mask(mask, query_len, key_len, is_causal, sliding_window, query_offset):
    """`mask` merged with the causal and sliding-window masks that apply."""
    if is_causal:
        mask = merge_masks(mask, causal_mask(query_len, key_len, query_offset))
    if sliding_window is not None:
        mask = merge_masks(mask, sliding_window_mask(query_len, key_len, sliding_window, query_offset))
    return mask


def may_empty_rows(mask, sliding_window):
    """Whether some query row may see no key: a causal mask alone never empties one (row `i` sees key 0)."""
    return mask is not None or sliding_window is not None
