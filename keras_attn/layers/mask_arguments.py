"""The mask arguments of an attention call: merged into one 4-D boolean mask, their shapes checked.

`MultiHeadAttention` takes padding masks (`query_mask`, `value_mask`, `key_mask`, each
`(batch, len)`) and an `attention_mask` of rank 2, 3 or 4 (as Keras takes it, or per head);
every mask is `True` where a query may attend to a key.
"""

from keras import ops

from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import padding_mask_to_attention_mask
from keras_attn.utils import check_padding_mask


def merged_mask(query_mask, value_mask, key_mask, attention_mask):
    """Merges padding masks and an explicit mask into one 4-D boolean mask (or `None`)."""
    if attention_mask is not None:
        rank = len(attention_mask.shape)
        if rank not in (2, 3, 4):
            raise ValueError(
                "`attention_mask` must have rank 2 (query_len, key_len), 3 (batch, query_len, "
                "key_len) or 4 (batch, heads, query_len, key_len). "
                f"Received: attention_mask.shape={tuple(attention_mask.shape)}"
            )
        if rank == 2:
            attention_mask = ops.expand_dims(attention_mask, 0)  # (1, q, k)
        if rank in (2, 3):
            attention_mask = ops.expand_dims(attention_mask, 1)  # (batch, 1, q, k)
    for name, padding in (("query_mask", query_mask), ("value_mask", value_mask), ("key_mask", key_mask)):
        check_padding_mask(name, padding)
    return merge_masks(
        padding_mask_to_attention_mask(query_mask, None),
        padding_mask_to_attention_mask(None, merge_masks(value_mask, key_mask)),
        attention_mask,
    )


def rows_with_keys(mask, query_len=None, key_len=None):
    """`(batch or 1, query_len)`: whether each query row of a merged 4-D `mask` sees any key in any head;
    `None` (every row) when `mask` is, unless there are no keys at all (a known `key_len` of 0).
    `False` for a padded query (its row of the mask is all `False`) and for a row whose keys the
    masks all exclude."""
    if mask is None:
        return ops.zeros((1, query_len), "bool") if key_len == 0 else None
    return ops.any(mask, axis=(1, 3))


def as_4d_mask(mask):
    """A `(q, k)`, `(batch, q, k)` or 4-D boolean mask as `(batch or 1, heads or 1, q, k)`."""
    mask = ops.cast(mask, "bool")
    while len(mask.shape) < 4:
        mask = ops.expand_dims(mask, -3)
    return mask


def check_mask_shapes(batch, query_len, heads, key_len, **tensors):
    """ValueError naming the mask/bias argument whose shape does not fit `batch` sequences of `query_len`
    queries in `heads` heads over `key_len` keys (static sizes, `None` where unknown)."""
    targets = {
        "query_mask": [(batch, query_len)],
        "value_mask": [(batch, key_len)],
        "key_mask": [(batch, key_len)],
        "attention_mask": [
            (query_len, key_len),
            (batch, query_len, key_len),
            (batch, heads, query_len, key_len),
        ],
        "attention_bias": [(batch, heads, query_len, key_len)],
    }
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        shape = tuple(tensor.shape)
        if not any(broadcastable_to(shape, target) for target in targets[name]):
            raise ValueError(
                f"`{name}` must be broadcastable to {' or '.join(map(str, targets[name]))}. "
                f"Received: {name}.shape={shape}"
            )


def broadcastable_to(shape, target):
    """Whether a static `shape` (`None` for an unknown size) broadcasts to `target` of the same rank."""
    return len(shape) == len(target) and all(
        received in (None, 1) or expected in (None, received) for received, expected in zip(shape, target)
    )
