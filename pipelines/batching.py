"""Batches of variable-length sequences in `tf.data`: declared batch counts and length buckets.

Nothing here is specific to one data set; `pipelines.imdb_data` and `pipelines.translation_data`
bucket with `bucket_boundaries`, and both trainers count their batches with `with_counted_batches`.
"""

import tensorflow as tf

from keras_attn import packing


def with_counted_batches(dataset):
    """`dataset` with its number of batches counted once (one pass) and declared as its cardinality.

    Keras then shows the steps in the first epoch's progress bar (`1/Unknown` otherwise, until
    epoch 2). Safe for shuffled, length-bucketed batches: each bucket batches its own elements, so
    the count does not depend on the order; `assert_cardinality` fails loudly if it ever did.
    """
    count = int(dataset.reduce(0, lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def bucket_boundaries(sequence_length, width):
    """`bucket_by_sequence_length` boundaries padding batches to multiples of `width`, at most `sequence_length`.

    A length `n` goes to the first bucket whose boundary exceeds it, so the boundaries are the
    padded lengths `width, 2 * width, ..., sequence_length` plus one.
    """
    lengths = list(range(width, sequence_length, width)) + [sequence_length]
    return [length + 1 for length in lengths]


def pack_documents(token_ids, row_length):
    """Packs a padded batch of documents into rows of `row_length` tokens (first fit, longest first).

    The batch keeps its documents: a packed model reads `packed_ids` and `segment_ids` and finds
    each document's tokens again through `token_index`, so per-document outputs, labels and losses
    keep the layout (and the values) of the padded batch. Graph-only (`tf.data` map functions).

    Args:
        token_ids: int `(documents, length)`, each document's tokens first, then 0s (padding).
        row_length: tokens per packed row, at least the longest document.

    Returns:
        A dict of int32 tensors: `packed_ids` `(rows, row_length)`, the documents laid end to end,
        0 after the last of a row; `segment_ids` `(rows, row_length)`, `i + 1` on the tokens of
        document `i` (unique in the batch, so runs never merge), 0 on padding; `token_index`
        `(documents, length)`, the position of each token in the flattened rows
        (`row * row_length + column`), 0 on padding.

    Raises:
        InvalidArgumentError: a document is longer than `row_length`.
    """
    token_ids = tf.convert_to_tensor(token_ids, tf.int32)
    lengths = tf.math.count_nonzero(token_ids, axis=1, dtype=tf.int32)  # (documents,)
    tf.debugging.assert_less_equal(
        lengths, row_length, message=f"`token_ids` holds a document longer than `row_length`={row_length}"
    )
    rows, offsets = _first_fit_decreasing(lengths, row_length)  # (documents,) each
    columns = tf.range(tf.shape(token_ids)[1], dtype=tf.int32)[None, :]  # (1, length)
    real = columns < lengths[:, None]  # (documents, length)
    token_index = tf.where(real, rows[:, None] * row_length + offsets[:, None] + columns, 0)
    row_count = tf.reduce_max(rows) + 1
    flat_shape = tf.reshape(row_count * row_length, [1])
    targets = tf.boolean_mask(token_index, real)[:, None]  # (tokens, 1)
    documents = tf.broadcast_to(tf.range(1, tf.shape(token_ids)[0] + 1, dtype=tf.int32)[:, None], tf.shape(token_ids))

    def laid_out(values):  # (documents, length) -> (rows, row_length)
        return tf.reshape(tf.scatter_nd(targets, tf.boolean_mask(values, real), flat_shape), [row_count, row_length])

    return {"packed_ids": laid_out(token_ids), "segment_ids": laid_out(documents), "token_index": token_index}


def _first_fit_decreasing(lengths, row_length):
    """Each document's row and offset: the documents, longest first, each into the first row with
    room (`keras_attn.packing.place`). `(rows, offsets)`, int32 `(documents,)`; rows used 0, 1, ..."""
    order = tf.argsort(lengths, direction="DESCENDING", stable=True)
    rows, offsets = packing.place(tf.gather(lengths, order), row_length)  # in the sorted order
    back = tf.argsort(order)  # each document's index in the sorted order
    return tf.gather(rows, back), tf.gather(offsets, back)
