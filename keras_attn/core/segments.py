"""Segment ids: several documents packed in one row, attention that never crosses them.

A row of `length` tokens holds documents numbered `1, 2, ...` by its int segment ids
`(batch, length)`; `0` marks padding. A query attends only to keys of its own document (equal,
non-zero ids); a query of segment 0 attends to nothing (zero output), a key of segment 0 is seen by
no query. This is T5X/seqio's `segment_ids`, FlashAttention's variable-length batches and xformers'
`BlockDiagonalMask` written as data: the kernels intersect it with the mask and the pattern
(`Causal()` then means causal within each document, a `SlidingWindow` a window within it), and the
blockwise and chunked kernels skip the blocks in which no query shares a document with a key
(`keras_attn.kernels.document_blocks`). Positions that restart per document come from `document_positions`.

Self-attention takes `segment_ids` (the same ids for queries and keys); cross-attention and cached
decoding take `query_segment_ids` `(batch, query_len)` and `key_segment_ids` `(batch, key_len)`.

What a document is, on every surface that takes segment ids, is `DOCUMENTS`.
"""

import dataclasses

import tensorflow as tf

from keras_attn import patterns
from keras_attn.core.masks import merge_masks
from keras_attn.validation import check_segment_ids

DOCUMENTS = """A document of a packed row is the set of its tokens that share one segment id > 0 (equal ids,
wherever they sit in the row); id 0 is padding, in no document. Ids are integers in `[0, 2**31 - 1]`:
a float id or a negative id is refused on every surface (`keras_attn.validation.check_segment_ids`).
Attention (every kernel), the pooling layers and `keras_attn.packing.unpack` honour any layout of the
ids. The surfaces that read a document as a span of its row (`document_positions` and the position
layers, `LSHSelfAttention`, `LinearAttention`) need each document to be one contiguous run and refuse
ids that reappear after another id (`[1, 1, 2, 2, 1]`): they would otherwise read two documents. The
ids a packer writes (`keras_attn.packing.pack`: `1, 2, ...` in order, each document contiguous) are
valid everywhere. Values are checked when they are known (eager calls); in a graph the shapes are."""


def resolve_segment_ids(segment_ids, query_segment_ids, key_segment_ids, query_len, key_len, batch=None, runs=False):
    """`(query_segment_ids, key_segment_ids)` as int32 from the call's arguments, `(None, None)` without.

    `segment_ids` is the self-attention shorthand (query and key lengths equal); it cannot be given
    with the two explicit ones, which must come together. Each is checked against `DOCUMENTS` and
    against the inputs' `batch` (where known) and its length; with `runs` each document must be one run.
    """
    if segment_ids is not None:
        if query_segment_ids is not None or key_segment_ids is not None:
            raise ValueError(
                "Pass either `segment_ids` (self-attention) or `query_segment_ids` and `key_segment_ids`, not both. "
                f"Received: segment_ids.shape={_shape(segment_ids)}, query_segment_ids.shape="
                f"{_shape(query_segment_ids)}, key_segment_ids.shape={_shape(key_segment_ids)}"
            )
        if query_len is not None and key_len is not None and query_len != key_len:
            raise ValueError(
                "`segment_ids` marks the documents of self-attention, where queries and keys are the same tokens; "
                "with different lengths pass `query_segment_ids` and `key_segment_ids`. "
                f"Received: segment_ids.shape={_shape(segment_ids)}, query_len={query_len}, key_len={key_len}"
            )
        query_segment_ids = key_segment_ids = segment_ids
    if (query_segment_ids is None) != (key_segment_ids is None):
        raise ValueError(
            "`query_segment_ids` and `key_segment_ids` come together (a query's document is matched against "
            f"the keys'). Received: query_segment_ids.shape={_shape(query_segment_ids)}, "
            f"key_segment_ids.shape={_shape(key_segment_ids)}"
        )
    if query_segment_ids is None:
        return None, None
    name = "segment_ids" if segment_ids is not None else None
    return (
        check_segment_ids(name or "query_segment_ids", query_segment_ids, batch, query_len, runs),
        check_segment_ids(name or "key_segment_ids", key_segment_ids, batch, key_len, runs),
    )


def _shape(tensor):
    return None if tensor is None else tuple(getattr(tensor, "shape", ()))


def segment_mask(query_segment_ids, key_segment_ids):
    """Boolean `(batch, 1, query_len, key_len)`: `True` where query and key belong to the same document.

    Padding (segment 0) attends to nothing and is attended by nothing. `keras_attn.patterns.document_mask`
    without a pattern.

    >>> segment_mask([[1, 1, 2, 0]], [[1, 1, 2, 0]])[0, 0].numpy().astype(int).tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    """
    return patterns.document_mask(query_segment_ids, key_segment_ids)


def with_segments_as_mask(call):
    """The `AttentionCall` with its segment ids merged into its mask: for a kernel that materialises the mask."""
    if call.query_segment_ids is None:
        return call
    return dataclasses.replace(
        call,
        mask=merge_masks(call.mask, segment_mask(call.query_segment_ids, call.key_segment_ids)),
        query_segment_ids=None,
        key_segment_ids=None,
    )


def document_positions(segment_ids):
    """Int32 `(batch, length)`: each token's position within its document, restarting at 0 where the id changes.

    Each document must be one contiguous run of its id (`DOCUMENTS`; eager ids that reappear after
    another id are refused); padding (id 0) gets position 0. The position ids of packed rows for the position embeddings and rotary, so a
    document packed at offset 300 is encoded as it is alone.

    Args:
        segment_ids: int `(batch, length)` document ids of packed rows (`DOCUMENTS`), `0` for
            padding; the length may be dynamic (also under XLA).

    Returns:
        Int32 `(batch, length)` positions.

    Example:

    >>> document_positions([[1, 1, 1, 2, 2, 0, 0]]).numpy().tolist()
    [[0, 1, 2, 0, 1, 0, 0]]
    """
    ids = check_segment_ids("segment_ids", segment_ids, runs=True)
    index = tf.broadcast_to(tf.range(tf.shape(ids)[1], dtype=tf.int32)[None, :], tf.shape(ids))  # (batch, length)
    previous = tf.pad(ids[:, :-1], [[0, 0], [1, 0]], constant_values=-1)  # the first token always starts a run
    run_starts = tf.where(tf.not_equal(ids, previous), index, tf.zeros_like(index))
    positions = index - _running_max(run_starts)
    return tf.where(tf.not_equal(ids, 0), positions, tf.zeros_like(positions))


def _running_max(values):
    """The running maximum along axis 1 of `(batch, length)` int32 `values`, by doubling shifts:
    elementwise ops only (log2(length) of them), so it runs under XLA and converts to ONNX."""
    length = values.shape[1]
    if length is None:
        return _running_max_dynamic(values)
    shift = 1
    while shift < length:
        values = tf.maximum(values, tf.pad(values[:, :-shift], [[0, 0], [shift, 0]]))
        shift *= 2
    return values


def _running_max_dynamic(values):
    length = tf.shape(values)[1]
    index = tf.range(length)

    def double(shift, values):
        # A gather, not a pad: XLA needs a pad's widths at compile time and `shift` changes per
        # iteration. Tokens before `shift` read token 0, which is already in their prefix's maximum.
        shifted = tf.gather(values, tf.maximum(index - shift, 0), axis=1)
        return shift * 2, tf.maximum(values, shifted)

    return tf.while_loop(lambda shift, _: shift < length, double, (tf.constant(1), values))[1]
