"""Where each token's document begins and ends in a packed row, for the families that work on runs.

A document is a contiguous run of one segment id (a packer places each document contiguously, as
`keras_attn.core.segments.document_positions` assumes); padding (id 0) is a run of its own per token.
LSH sorts each document's tokens together and linear attention restarts its sums at each run, so both
read the runs' bounds, elementwise and without a `(length, length)` comparison.
"""

import tensorflow as tf

from keras_attn.core.segments import document_positions


def document_bounds(segment_ids):
    """`(start, end)`, int32 `(batch, length)`: the first and last index of each token's document (itself for padding).

    >>> start, end = document_bounds([[1, 1, 1, 2, 2, 0]])
    >>> start.numpy().tolist(), end.numpy().tolist()
    ([[0, 0, 0, 3, 3, 5]], [[2, 2, 2, 4, 4, 5]])
    """
    ids = tf.cast(segment_ids, tf.int32)
    index = tf.broadcast_to(tf.range(tf.shape(ids)[1], dtype=tf.int32)[None, :], tf.shape(ids))  # (batch, length)
    to_end = tf.reverse(document_positions(tf.reverse(ids, axis=[1])), axis=[1])  # tokens after it in its run
    return index - document_positions(ids), index + to_end
