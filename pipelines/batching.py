"""Batches of variable-length sequences in `tf.data`: declared batch counts and length buckets.

Nothing here is specific to one data set; `pipelines.imdb_data` and `pipelines.translation_data`
bucket with `bucket_boundaries`, and both trainers count their batches with `with_counted_batches`.
"""

import tensorflow as tf


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
