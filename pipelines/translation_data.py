"""Parallel-text data for the translator: a seeded split, vocabularies and `tf.data`.

Reading the pairs (`models.parallel_text`), the tokenisation (`models.translation_text`) and the
run's recorded split (`models.translator_run`) belong to the model; this module adapts the
vocabularies on the training sentences and builds the teacher-forcing datasets.
"""

import numpy as np
import tensorflow as tf

from keras_attn.packing import pack
from models.translation_text import END_TOKEN
from models.translation_text import START_TOKEN
from models.translation_text import translation_vectorizer
from pipelines.batching import bucket_boundaries

SPLIT_METHODS = ("source", "pair")
# How training batches are laid out: every batch padded to the sequence length, batches of similar
# lengths padded to their bucket (`make_dataset`), or rows packing several pairs (`make_packed_dataset`).
LAYOUTS = ("padded", "bucketed", "packed")
BUCKET_WIDTH = 4


def _check_fractions(validation_fraction, test_fraction):
    for name, fraction in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < fraction < 0.5:
            raise ValueError(f"`{name}` must be in (0, 0.5). Received: {name}={fraction}")


def _cut(order, validation_fraction, test_fraction):
    """`{"test", "validation", "train"}` slices of the permutation `order`, in that order."""
    count = len(order)
    num_test = max(1, int(round(count * test_fraction)))
    num_validation = max(1, int(round(count * validation_fraction)))
    if num_test + num_validation >= count:
        raise ValueError(f"Too few items to split. Received: {count} items")
    return {
        "test": order[:num_test],
        "validation": order[num_test : num_test + num_validation],
        "train": order[num_test + num_validation :],
    }


def split_indices(num_pairs, seed, validation_fraction=0.1, test_fraction=0.1):
    """A fixed, seeded permutation of `range(num_pairs)` cut into train/validation/test (by pair).

    Returns:
        A dict `{"train": ..., "validation": ..., "test": ...}` of sorted int arrays.
    """
    _check_fractions(validation_fraction, test_fraction)
    order = np.random.default_rng(seed).permutation(num_pairs)
    return {name: np.sort(part) for name, part in _cut(order, validation_fraction, test_fraction).items()}


def split_by_source(sources, seed, validation_fraction=0.1, test_fraction=0.1):
    """A seeded split of the pairs in which every pair of a source sentence falls on one side.

    The distinct source sentences are permuted and cut by the fractions (of sources, so the pair
    counts follow); a sentence's several translations all land in the same split, so no test
    source is ever seen in training, and the test set holds every reference of its sources.

    Returns:
        A dict `{"train": ..., "validation": ..., "test": ...}` of sorted int pair indices.
    """
    _check_fractions(validation_fraction, test_fraction)
    distinct, pair_source = np.unique(np.asarray(sources, dtype=object).astype(str), return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(distinct))
    parts = _cut(order, validation_fraction, test_fraction)  # distinct-source ids per split
    side = np.empty(len(distinct), np.int64)
    for number, part in enumerate(parts.values()):
        side[part] = number
    pair_side = side[pair_source.reshape(-1)]
    return {name: np.flatnonzero(pair_side == number) for number, name in enumerate(parts)}


def split_pairs(sources, method, seed, validation_fraction=0.1, test_fraction=0.1):
    """`split_by_source` (method "source") or `split_indices` (method "pair", the old split)."""
    if method not in SPLIT_METHODS:
        raise ValueError(f"`method` must be one of {SPLIT_METHODS}. Received: method={method!r}")
    if method == "source":
        return split_by_source(sources, seed, validation_fraction, test_fraction)
    return split_indices(len(sources), seed, validation_fraction, test_fraction)


def build_vocabularies(sources, targets, source_vocabulary_size, target_vocabulary_size):
    """Adapts the source and target vocabularies on the training sentences.

    Returns:
        `(source_vocabulary, target_vocabulary)`, lists of tokens without the padding and OOV
        entries (`TextVectorization(vocabulary=...)` adds them back at ids 0 and 1); the target
        list starts with `[start]` and `[end]` (ids 2 and 3).
    """
    vocabularies = []
    for texts, size, lowercase, reserved in (
        (sources, source_vocabulary_size, True, []),
        (targets, target_vocabulary_size, False, [START_TOKEN, END_TOKEN]),
    ):
        vectorizer = translation_vectorizer(lowercase=lowercase, max_tokens=size - len(reserved))
        vectorizer.adapt(tf.data.Dataset.from_tensor_slices(list(texts)).batch(4096))
        tokens = vectorizer.get_vocabulary(include_special_tokens=False)
        vocabularies.append(reserved + [str(token) for token in tokens])
    return tuple(vocabularies)


def _teacher_forcing(source_ids, target_ids):
    """`((source, target_in), target_out)`: the decoder reads `[start] w1 .. wn` for `w1 .. [end]`."""
    return (source_ids, target_ids[:-1]), target_ids[1:]


def teacher_forcing_pairs(vectorizers, sources, targets, drop_long=True):
    """A cached `tf.data.Dataset` of `((source, target_in), target_out)` int32 pairs, one per sentence pair.

    Args:
        vectorizers: a `TranslationVectorizers`.
        sources, targets: lists of sentences.
        drop_long: drop pairs longer than `vectorizers.sequence_length` (else truncate them).
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"`sources` and `targets` must have the same length. Received: {len(sources)} and {len(targets)}"
        )
    length = vectorizers.sequence_length
    start = tf.constant([vectorizers.start_id], tf.int64)
    end = tf.constant([vectorizers.end_id], tf.int64)

    def vectorize(source_text, target_text):
        source_ids = vectorizers.source(source_text)
        target_ids = vectorizers.target(target_text)
        return source_ids, target_ids

    def add_special_tokens(source_ids, target_ids):
        target_ids = tf.concat([start, target_ids, end], axis=0)
        return tf.cast(source_ids, tf.int32), tf.cast(target_ids, tf.int32)

    def fits(source_ids, target_ids):
        return tf.logical_and(tf.size(source_ids) <= length, tf.size(target_ids) <= length + 1)

    def truncate(source_ids, target_ids):
        return source_ids[:length], tf.concat([target_ids[:length], target_ids[-1:]], 0)[: length + 1]

    dataset = tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
    dataset = dataset.batch(4096).map(vectorize).unbatch().map(add_special_tokens)
    dataset = dataset.filter(fits) if drop_long else dataset.map(truncate)
    return dataset.map(_teacher_forcing).cache()


def make_dataset(
    vectorizers,
    sources,
    targets,
    tokens_per_batch=4096,
    shuffle=False,
    seed=0,
    drop_long=True,
    max_batch_size=None,
    bucket_width=BUCKET_WIDTH,
):
    """A teacher-forcing `tf.data.Dataset` of `((source, target_in), target_out)` int32 batches.

    Pairs are vectorised once and cached; batches group sentences of similar length
    (`bucket_by_sequence_length`, padded to the bucket boundary so that compiled shapes are few)
    with about `tokens_per_batch` tokens each, and are prefetched.

    Args:
        vectorizers: a `TranslationVectorizers`.
        sources, targets: lists of sentences.
        tokens_per_batch: padded tokens per batch (per side); short buckets get more sentences.
        shuffle: shuffle pairs each epoch (training).
        seed: shuffle seed.
        drop_long: drop pairs longer than `vectorizers.sequence_length` (else truncate them).
        max_batch_size: optional cap on the sentences in a batch.
        bucket_width: the batches' lengths are multiples of it (capped at the sequence length);
            `vectorizers.sequence_length` pads every batch to that length (one bucket).
    """
    length = vectorizers.sequence_length
    dataset = teacher_forcing_pairs(vectorizers, sources, targets, drop_long)
    if shuffle:
        dataset = dataset.shuffle(len(sources), seed=seed, reshuffle_each_iteration=True)
    boundaries = bucket_boundaries(length, width=bucket_width)
    # One batch size per bucket, plus one for the (empty) bucket past the last boundary.
    batch_sizes = [max(1, tokens_per_batch // (boundary - 1)) for boundary in boundaries + boundaries[-1:]]
    if max_batch_size:
        batch_sizes = [min(size, max_batch_size) for size in batch_sizes]
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda inputs, target_out: tf.maximum(tf.size(inputs[0]), tf.size(target_out)),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        pad_to_bucket_boundary=True,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_packed_dataset(vectorizers, sources, targets, row_length, tokens_per_batch=4096, shuffle=False, seed=0):
    """Teacher-forcing batches of packed rows: `((source, target_in, source_segment_ids,
    target_segment_ids), target_out)`, int32, every tensor `(rows, row_length)`.

    Each row holds several sentence pairs (`keras_attn.packing.pack`, first fit): pair `i` of a
    row is segment `i` of its encoder row and of its decoder row (0 is padding), which is what
    `models.translator.Translator` reads to keep attention inside each pair; `target_out` is 0
    past the real tokens, so the loss averages over the same tokens as unpacked. Pairs longer than
    `vectorizers.sequence_length` are dropped (as `make_dataset(drop_long=True)`).

    Args:
        vectorizers: a `TranslationVectorizers`.
        sources, targets: lists of sentences.
        row_length: tokens per row on each side, at least `vectorizers.sequence_length`.
        tokens_per_batch: tokens per batch on each side: `tokens_per_batch // row_length` rows.
        shuffle: shuffle the pairs once before they are packed (how many rows they fill depends on
            their order, and an epoch's batches are counted once), then the rows each epoch (training).
        seed: shuffle seed.
    """
    if row_length < vectorizers.sequence_length:
        raise ValueError(
            "`row_length` must hold the longest sentence, `sequence_length` "
            f"({vectorizers.sequence_length}). Received: row_length={row_length}"
        )
    dataset = teacher_forcing_pairs(vectorizers, sources, targets)
    if shuffle:  # once: the rows, and so the batches per epoch, must not change in number between epochs
        dataset = dataset.shuffle(len(sources), seed=seed, reshuffle_each_iteration=False)
    dataset = dataset.map(
        lambda inputs, target_out: {"source": inputs[0], "target_in": inputs[1], "target_out": target_out}
    )
    rows = pack(dataset, row_length).cache()
    if shuffle:  # each epoch: the rows
        rows = rows.shuffle(len(sources), seed=seed, reshuffle_each_iteration=True)
    batches = rows.batch(max(1, tokens_per_batch // row_length)).map(_packed_teacher_forcing)
    return batches.prefetch(tf.data.AUTOTUNE)


def _packed_teacher_forcing(rows):
    inputs = (rows["source"], rows["target_in"], rows["source_segment_ids"], rows["target_in_segment_ids"])
    return inputs, rows["target_out"]


def layout_batches(layout, vectorizers, sources, targets, tokens_per_batch, row_length, shuffle=False, seed=0):
    """The teacher-forcing batches of the pairs laid out as `layout` (one of `LAYOUTS`), about
    `tokens_per_batch` token slots each; `row_length` is the packed rows' length. Every layout
    holds the same pairs (those that fit `vectorizers.sequence_length`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}")
    if layout == "packed":
        return make_packed_dataset(vectorizers, sources, targets, row_length, tokens_per_batch, shuffle, seed)
    width = vectorizers.sequence_length if layout == "padded" else BUCKET_WIDTH
    return make_dataset(vectorizers, sources, targets, tokens_per_batch, shuffle, seed, bucket_width=width)
