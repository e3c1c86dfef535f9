"""Which blocks of a packed row's attention a streaming kernel may skip, decided from the segment ids.

A block is a set of queries against a set of keys (a chunk's tile, a band chunk, a residue step).
No query of it shares a document with a key when, in every row of the batch, the documents of its
queries and those of its keys are apart; the kernel then leaves the block out (`tf.cond`) instead of
computing weights that the document mask sets to 0.

The test compares id ranges, not id sets: per row, the smallest and largest non-zero id of the
queries against those of the keys (`O(queries + keys)` instead of the `O(queries * keys)` of the
document mask). It is exact for rows whose document ids increase along the row (what a packer
writes: documents numbered in the order they are placed) and conservative otherwise: a block whose
ranges overlap is computed, and its document mask (`keras_attn.core.segments.segment_mask`, built
from the ids of the block's own queries and keys) still keeps every pair apart. Padding (id 0)
belongs to no document, so a block of padding queries or padding keys is skipped.
"""

import tensorflow as tf


def id_range(ids, axis=1):
    """The smallest and largest non-zero id along `axis` of int32 `ids` `(batch, ...)`: a block's
    documents; an all-padding block gets the empty range `(int32 max, int32 min)`."""
    real = tf.not_equal(ids, 0)
    low = tf.reduce_min(tf.where(real, ids, tf.int32.max), axis)
    high = tf.reduce_max(tf.where(real, ids, tf.int32.min), axis)
    return low, high


def may_share_document(query_ids, key_ids):
    """Scalar bool: whether some query of `query_ids` `(batch, queries)` may attend to a key of
    `key_ids` `(batch, keys)`, in any row of the batch (overlapping id ranges)."""
    (query_low, query_high), (key_low, key_high) = id_range(query_ids), id_range(key_ids)
    overlap = tf.logical_and(query_low <= key_high, key_low <= query_high)  # (batch,)
    return tf.reduce_any(overlap)


def guarded(may_share, compute, skipped):
    """`compute()` when the block may share a document (`may_share`, a scalar bool tensor), else
    `skipped()` (what the block contributes when left out); `may_share=None` means always computed."""
    if may_share is None:
        return compute()
    # The branches are plain TensorFlow: AutoGraph converting them again at each trace only costs time.
    return tf.cond(
        may_share,
        tf.autograph.experimental.do_not_convert(compute),
        tf.autograph.experimental.do_not_convert(skipped),
    )
