"""Boolean attention masks: causal, sliding window, padding, and their intersection.

Every mask is `True` where a query may attend to a key and broadcasts to
`(batch, heads, query_len, key_len)`. The positional rules (causal, band, strided, ...) are
written once, in `keras_attn.patterns`; the dense, chunked and blockwise kernels all build their
masks through `pattern_mask`.
"""

from keras import ops

from keras_attn import patterns
from keras_attn.validation import check_broadcastable


def causal_mask(query_len, key_len, query_offset=0):
    """Boolean lower-triangular mask, `True` where query `i` may attend to key `j <= i + offset`.

    With `query_offset=0` it is aligned at the top left, as
    `keras.layers.MultiHeadAttention(use_causal_mask=True)`: query `i` sees keys `0..i` even when
    `key_len != query_len`. In cached decoding the queries are the tokens at positions
    `query_offset, query_offset + 1, ...` of a key/value cache of length `key_len`.
    The mask of `keras_attn.patterns.Causal()`.

    Args:
        query_len: number of queries.
        key_len: number of keys.
        query_offset: position of the first query (an int or a scalar int tensor).

    Returns:
        A boolean tensor of shape `(1, 1, query_len, key_len)`.

    Example:

    >>> causal_mask(3, 3)[0, 0].numpy().astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    return patterns.Causal().block_mask(query_len, key_len, query_offset)


def sliding_window_mask(query_len, key_len, window, query_offset=0):
    """Boolean band mask, `True` where `|i + query_offset - j| < window` (local attention).

    The same band as `keras.layers.MultiHeadAttention(sliding_window=window)`; combined with
    `causal_mask` it gives the causal sliding window of Mistral-style models. `query_offset` is
    the position of the first query, as in `causal_mask`. The mask of
    `keras_attn.patterns.SlidingWindow(window)`.

    Args:
        query_len: number of queries.
        key_len: number of keys.
        window: positive int, the band's half-width plus one.
        query_offset: position of the first query (an int or a scalar int tensor).

    Returns:
        A boolean tensor of shape `(1, 1, query_len, key_len)`.

    Example:

    >>> sliding_window_mask(4, 4, 2)[0, 0].numpy().astype(int).tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    return patterns.SlidingWindow(window).block_mask(query_len, key_len, query_offset)


def merge_masks(*masks):
    """Logical AND of the masks that are not `None`; `None` when all are `None`.

    Args:
        *masks: boolean masks (or `None`), broadcastable to one another (a `ValueError` names
            those whose known shapes are not).

    Example:

    >>> merge_masks(causal_mask(3, 3), None, sliding_window_mask(3, 3, 2))[0, 0].numpy().astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    check_broadcastable(**{f"masks[{index}]": mask for index, mask in enumerate(masks)})
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
    rows = (
        None if query_mask is None else ops.reshape(ops.cast(query_mask, "bool"), (ops.shape(query_mask)[0], 1, -1, 1))
    )  # (batch, 1, query_len, 1)
    cols = (
        None if key_mask is None else ops.reshape(ops.cast(key_mask, "bool"), (ops.shape(key_mask)[0], 1, 1, -1))
    )  # (batch, 1, 1, key_len)
    return merge_masks(rows, cols)


def pattern_mask(mask, pattern, query_len, key_len, query_offset=0, key_offset=0):
    """`mask` merged with `pattern`'s mask of queries at `query_offset + i`, keys at `key_offset + j`."""
    if pattern is None:
        return mask
    return merge_masks(mask, pattern.block_mask(query_len, key_len, query_offset, key_offset))


def may_empty_rows(mask, pattern):
    """Whether some query row may see no key (then its weights and output are zeroed)."""
    return mask is not None or (pattern is not None and pattern.may_empty_rows)


def zero_padding(tensor, padding_mask):
    """`tensor` `(batch, seq, ...)` with exact zeros at the positions `padding_mask` `(batch, seq)` marks `False`.

    A selection, not a product: `0 * NaN` is NaN, and a product's gradient with respect to the rest of
    the graph multiplies by the padded values, whereas the gradient of `where` never reads the branch it
    did not select. So whatever a padded position holds (NaN and inf included) reaches neither the
    outputs nor any gradient. `tensor` unchanged when `padding_mask` is `None`.

    >>> import numpy as np
    >>> zero_padding(np.array([[1.0, np.nan]], "float32"), np.array([[True, False]])).numpy().tolist()
    [[1.0, 0.0]]
    """
    if padding_mask is None:
        return tensor
    mask = ops.cast(padding_mask, "bool")
    for _ in range(len(tensor.shape) - 2):
        mask = ops.expand_dims(mask, -1)  # (batch, seq, 1, ...)
    return zero_masked(tensor, mask)


def either_mask(first, second):
    """Logical OR of two padding masks (a position real in one of them); `None` when one is `None`
    (every position real there)."""
    if first is None or second is None:
        return None
    return ops.logical_or(ops.cast(first, "bool"), ops.cast(second, "bool"))


def keras_rows_without_keys(output, value, allowed, is_causal, query_len, key_len):
    """`output` `(batch, query_len, heads, value_depth)` with each query row that has no allowed key
    set to the mean of `value` over all the keys (Keras's uniform softmax of equal masked logits).

    `allowed` is the boolean `(batch | 1, heads | 1, query_len | 1, key_len | 1)` mask (bias masking
    merged in); the causal mask, when given, is intersected without building a `(query_len,
    key_len)` tensor for a mask that is the same for every query (padding). The `where` gives the
    mean rows Keras's gradient: `dO / key_len` to every value, nothing to the kernel's zero rows.
    """
    if isinstance(key_len, int) and key_len == 0:  # no keys at all: Keras's sum over none is zero, as ours
        return output
    has_keys = _rows_with_any_key(allowed, is_causal, query_len, key_len)  # (batch | 1, heads | 1, query_len | 1)
    has_keys = ops.expand_dims(ops.transpose(has_keys, (0, 2, 1)), -1)  # (batch | 1, query_len | 1, heads | 1, 1)

    # A decoding step's mean is a pass over its whole cache: taken only when a row needs it. Any other
    # call's is a pass over the values beside the attention's, taken always: a condition's gradient
    # would keep zeros of the values' size as a constant of the graph, for the process's life.
    if output.shape[1] == 1:
        mean = ops.cond(
            ops.all(has_keys), lambda: ops.zeros_like(value[:, :1]), lambda: ops.mean(value, axis=1, keepdims=True)
        )  # (batch, 1, kv_heads, value_depth)
    else:
        mean = ops.mean(value, axis=1, keepdims=True)  # (batch, 1, kv_heads, value_depth)
    mean = ops.repeat(mean, output.shape[2] // value.shape[2], axis=2)  # grouped heads: (batch, 1, heads, dv)
    return ops.where(has_keys, output, ops.cast(mean, output.dtype))


def _rows_with_any_key(allowed, is_causal, query_len, key_len):
    """Whether each query row has an allowed key: `(batch | 1, heads | 1, query_len | 1)`."""
    if allowed.shape[3] == 1 or not is_causal:  # causal query i always sees key 0, so only the mask decides
        return ops.any(allowed, axis=-1)
    if allowed.shape[2] == 1:  # one row for all queries: query i has a key iff one of keys 0..i is allowed
        seen = ops.cumsum(ops.cast(allowed[:, :, 0], "int32"), axis=-1) > 0  # (batch | 1, heads | 1, key_len)
        return ops.take(seen, ops.minimum(ops.arange(query_len), key_len - 1), axis=-1)
    causal = ops.arange(key_len)[None, :] <= ops.arange(query_len)[:, None]  # (query_len, key_len)
    return ops.any(ops.logical_and(allowed, causal), axis=-1)


def zero_masked(tensor, mask):
    """`tensor` where `mask` (broadcastable to it) is `True`, exactly 0 elsewhere: masked weights,
    a fully masked row's (which would softmax to uniform weights), padded positions' outputs.

    The zero is a scalar, broadcast by the selection: a `zeros_like(tensor)` is a tensor as large as
    `tensor`, which TensorFlow's graph optimiser folds into a constant the graph keeps for the
    process's life when the shape is static, and which it allocates apart from the computation's
    order (a chunked kernel's chunks would hold every chunk's zeros at once).

    >>> import numpy as np
    >>> zero_masked(np.array([[1.0, np.nan]], "float32"), np.array([[True, False]])).numpy().tolist()
    [[1.0, 0.0]]
    """
    return ops.where(mask, tensor, ops.zeros((), tensor.dtype))
