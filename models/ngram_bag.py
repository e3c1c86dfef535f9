"""Weighted bags of token unigrams and bigrams (hashed, or a learnt bigram vocabulary), computed in the graph from token ids."""

import keras
import numpy as np
from keras import ops

from keras_attn.utils import checked_ids
from keras_attn.validation import check_choice
from keras_attn.validation import check_positive_int
from models.serialization import register_serializable
from models.vocabulary import FIRST_TOKEN_ID

# How `NgramBag.adapt` weighs each feature (see the class docstring).
WEIGHTINGS = ("idf", "naive_bayes")
# How a bigram becomes a feature id (see the class docstring).
BIGRAM_IDS = ("hashed", "vocabulary")
# The largest `vocabulary_size` whose bigram keys `a * vocabulary_size + b` fit in int32.
MAX_VOCABULARY_FOR_BIGRAM_KEYS = 46_340
_NO_KEY = np.iinfo(np.int32).max  # pads the sorted bigram vocabulary: above every real key


@register_serializable()
class NgramBag(keras.layers.Layer):
    """Weighted bag (norm `scale`) of the unigrams and bigrams of each token-id sequence, sparse.

    Feature `t < vocabulary_size` is the token id `t`; feature `vocabulary_size + h` is a bigram
    of neighbouring tokens `a, b`, with `h` by `bigram_ids`:

    - "hashed": `h = (a * multiplier + b) mod num_buckets`, so bigrams may share a bucket (and so
      a weight);
    - "vocabulary": `h` is the bigram's index in a bigram vocabulary that `adapt` learns, the
      `num_buckets` bigrams found in most training documents: every bigram has its own feature,
      and a bigram not in the vocabulary is none (as an out-of-vocabulary token). The lookup is a
      binary search over the sorted keys `a * vocabulary_size + b` (gathers and comparisons:
      under XLA and in ONNX Runtime alike); `vocabulary_size` is at most
      `MAX_VOCABULARY_FOR_BIGRAM_KEYS` (int32 keys).

    A feature's value is binary (present or not) times its weight, learnt by `adapt` from the
    training documents:

    - "idf": the smooth inverse document frequency of scikit-learn's
      `TfidfVectorizer(binary=True)`, `log((1 + n) / (1 + df)) + 1`: a TF-IDF vector;
    - "naive_bayes": the log-count ratio of Wang & Manning's NBSVM (2012), `r = log((p / |p|) /
      (q / |q|))` with `p = 1 + (documents of label 1 holding the feature)` and `q` the same for
      label 0: the evidence of the feature for label 1 under naive Bayes (needs the labels).
      A logistic regression on these values is NBSVM's NB-LR; on IMDB it beats the TF-IDF one
      (docs/models/imdb_classifier.md).

    Padding and out-of-vocabulary tokens, and bigrams that contain one, are not features. The
    vector is L2-normalised and multiplied by `scale`.

    The output is sparse, a pair `(features, values)`: every unigram and bigram position's feature
    id, sorted, and its value at its first occurrence (0 at repeats and non-features).
    `SparseLinear` on top is a bag-of-n-grams logistic regression, the classic strong baseline of
    sentiment classification (Wang & Manning, 2012), at the cost of the review's length rather
    than of the feature space: a sort, a gather, no `(batch, num_features)` tensor, under XLA and
    in ONNX Runtime alike.

    Args:
        vocabulary_size: token ids are in `[0, vocabulary_size)`.
        num_buckets: size of the bigram feature space: hash buckets, or bigrams in the vocabulary.
        weighting: one of `WEIGHTINGS`, what `adapt` learns.
        bigram_ids: one of `BIGRAM_IDS`, how a bigram becomes a feature.
        multiplier: the hash multiplier, an odd prime; `a * multiplier + b` must stay below
            2**31 for every token id (int32 arithmetic): with the default, vocabularies up to
            71,000 tokens.
        scale: the norm of the output vector. A larger norm makes the linear model on top learn
            faster under an optimizer shared with other branches (Adam's steps are the same size
            in every weight, so the logit moves `scale` times as fast).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        token_ids: int `(batch, seq)` in `[0, vocabulary_size)`, 0 = padding, 1 =
            out-of-vocabulary (an id out of range would pose as a bigram feature: a
            `ValueError` naming `token_ids` eagerly, a run-time assertion in `tf.function`).

    Returns:
        `(features, values)`: int32 and float32, both `(batch, 2 * seq - 1)`.

    Example:

    >>> layer = NgramBag(vocabulary_size=10, num_buckets=16, weighting="naive_bayes")
    >>> layer.adapt(np.array([[2, 3, 4, 0], [2, 5, 0, 0]]), labels=np.array([1, 0]))
    >>> features, values = layer(np.array([[2, 3, 4, 5]]))  # (1, 7) each
    >>> round(float(keras.ops.sum(values**2)), 4)
    1.0
    """

    def __init__(
        self, vocabulary_size, num_buckets, weighting="idf", multiplier=30_011, scale=1.0, bigram_ids="hashed", **kwargs
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_buckets", num_buckets)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_bigram_ids(bigram_ids, vocabulary_size)
        check_positive_int("multiplier", multiplier)
        if not scale > 0:
            raise ValueError(f"`scale` must be positive. Received: scale={scale!r}")
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.num_buckets = num_buckets
        self.weighting = weighting
        self.multiplier = multiplier
        self.scale = scale
        self.bigram_ids = bigram_ids
        self.num_features = vocabulary_size + num_buckets
        self.feature_weights = self.add_weight(
            shape=(self.num_features,), initializer="ones", trainable=False, dtype="float32", name="feature_weights"
        )
        self.bigram_vocabulary = add_bigram_vocabulary(self) if bigram_ids == "vocabulary" else None

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}"
            )

    def feature_ids(self, token_ids):
        """Feature ids `(batch, 2 * seq - 1)` of every unigram and bigram; 0 where none."""
        return ngram_feature_ids(
            token_ids, self.vocabulary_size, self.num_buckets, self.multiplier, self.bigram_vocabulary
        )

    def first_occurrences(self, token_ids):
        """Sorted feature ids `(batch, 2 * seq - 1)` and where each feature is counted (once)."""
        return first_occurrences(self.feature_ids(token_ids))

    def call(self, token_ids):
        features, counted = self.first_occurrences(token_ids)  # (batch, 2 * seq - 1) each
        weights = ops.take(self.feature_weights, features)  # (batch, 2 * seq - 1)
        values = ops.where(counted, weights, ops.zeros((), "float32"))
        norm = ops.sqrt(ops.maximum(ops.sum(values * values, axis=-1, keepdims=True), 1e-12))  # (batch, 1)
        return features, values * (self.scale / norm)

    def densify(self, features, values):
        """The dense vectors `(batch, num_features)` of `call`'s sparse output (for tests)."""
        one_hot = ops.one_hot(features, self.num_features)  # (batch, 2 * seq - 1, num_features)
        return ops.einsum("bn,bnf->bf", values, one_hot)

    def adapt(self, data, labels=None, batch_size=256):
        """Learns the feature weights (`weighting`) from the training documents only; with
        `bigram_ids="vocabulary"`, first the bigram vocabulary: the `num_buckets` bigrams held by most
        documents (ties: the smaller key `a * vocabulary_size + b`).

        Args:
            data: an int array `(documents, seq)` of token ids, or a dataset of `(batch, seq)` id
                batches or of `(ids, label)` pairs.
            labels: 0/1 array `(documents,)` beside an array `data`; "naive_bayes" needs labels,
                from here or from the dataset's pairs.
            batch_size: documents counted at once when `data` is an array.
        """
        vocabulary = None  # the bigram vocabulary: learnt first, its features counted next
        if self.bigram_vocabulary is not None:
            vocabulary = frequent_bigrams(self._document_bigram_keys(data, labels, batch_size), self.num_buckets)
        # Documents holding each feature (once per document), by label.
        counts = {label: np.zeros(self.num_features, np.float64) for label in (0, 1)}
        documents = 0
        for batch, batch_labels in _labelled_batches(data, labels, batch_size):
            features, counted = (
                ops.convert_to_numpy(t)
                for t in first_occurrences(
                    ngram_feature_ids(batch, self.vocabulary_size, self.num_buckets, self.multiplier, vocabulary)
                )
            )
            if self.weighting == "idf":  # the labels play no part: every document counts under 0
                batch_labels = np.zeros(len(features), np.int64)
            elif batch_labels is None:
                raise ValueError(
                    "weighting='naive_bayes' learns from labelled documents: pass `labels` or a dataset "
                    f"of (ids, label) pairs. Received: labels=None and data={type(data).__name__}"
                )
            else:
                batch_labels = _binary_labels(batch_labels)
            for label, count in counts.items():
                holds = np.logical_and(counted, (batch_labels == label)[:, None])
                np.add.at(count, features[holds], 1.0)
            documents += features.shape[0]
        if documents == 0:
            raise ValueError(f"`data` holds no documents. Received: data={data!r}")
        if self.weighting == "idf":
            weights = np.log((1.0 + documents) / (1.0 + counts[0] + counts[1])) + 1.0
        else:
            positive, negative = 1.0 + counts[1], 1.0 + counts[0]
            weights = np.log((positive / positive.sum()) / (negative / negative.sum()))
        if vocabulary is not None:
            self.bigram_vocabulary.assign(vocabulary)
        self.feature_weights.assign(weights.astype("float32"))

    def _document_bigram_keys(self, data, labels, batch_size):
        """Each document's distinct bigram keys, one array per batch (document index * 2**31 + key)."""
        for batch, _ in _labelled_batches(data, labels, batch_size):
            token_ids = checked_int32_ids(batch, self.vocabulary_size)
            keys, real = (ops.convert_to_numpy(t) for t in bigram_keys(token_ids, self.vocabulary_size))
            documents = np.broadcast_to(np.arange(len(keys), dtype=np.int64)[:, None], keys.shape)
            yield np.unique(documents[real] * 2**31 + keys[real])

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else max(2 * input_shape[1] - 1, 0)
        return (input_shape[0], length), (input_shape[0], length)

    def compute_output_spec(self, token_ids):
        features_shape, values_shape = self.compute_output_shape(token_ids.shape)
        return keras.KerasTensor(features_shape, "int32"), keras.KerasTensor(values_shape, "float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_buckets": self.num_buckets,
                "weighting": self.weighting,
                "multiplier": self.multiplier,
                "scale": self.scale,
                "bigram_ids": self.bigram_ids,
            }
        )
        return config


def check_bigram_ids(bigram_ids, vocabulary_size):
    """`bigram_ids` if it is one of `BIGRAM_IDS` that `vocabulary_size` allows, else a `ValueError`."""
    check_choice("bigram_ids", bigram_ids, BIGRAM_IDS)
    if bigram_ids == "vocabulary" and vocabulary_size > MAX_VOCABULARY_FOR_BIGRAM_KEYS:
        raise ValueError(
            f"bigram_ids='vocabulary' keys each bigram as an int32 `a * vocabulary_size + b`: `vocabulary_size` must "
            f"be at most {MAX_VOCABULARY_FOR_BIGRAM_KEYS}. Received: vocabulary_size={vocabulary_size}"
        )
    return bigram_ids


def add_bigram_vocabulary(layer):
    """`layer`'s `(num_buckets,)` int32 weight of sorted bigram keys (`bigram_keys`), padded with a
    key above every real one: the vocabulary of `bigram_ids="vocabulary"`, learnt by `NgramBag.adapt`."""
    return layer.add_weight(
        shape=(layer.num_buckets,),
        initializer=keras.initializers.Constant(_NO_KEY),
        trainable=False,
        dtype="int32",
        name="bigram_vocabulary",
    )


def frequent_bigrams(document_keys, size):
    """The sorted `(size,)` int32 vocabulary of the `size` bigram keys held by most documents (ties:
    the smaller key), padded with `_NO_KEY`, from `document_keys`: arrays of document * 2**31 + key."""
    keys, documents = np.unique(np.concatenate([np.zeros(0, np.int64), *document_keys]) % 2**31, return_counts=True)
    chosen = np.sort(keys[np.lexsort((keys, -documents))[:size]])
    return np.concatenate([chosen, np.full(size - len(chosen), _NO_KEY, np.int64)]).astype(np.int32)


def ngram_feature_ids(token_ids, vocabulary_size, num_buckets, multiplier, bigram_vocabulary=None):
    """Feature ids `(batch, 2 * seq - 1)` of every unigram and bigram of the token ids, once every id
    is known to lie in `[0, vocabulary_size)` (`checked_ids`): the token ids, then
    `vocabulary_size +` each bigram's bucket (or, given the sorted keys `bigram_vocabulary`, its
    index there); 0 where a bigram holds padding or an out-of-vocabulary token, or is not in
    `bigram_vocabulary`."""
    token_ids = checked_int32_ids(token_ids, vocabulary_size)
    if bigram_vocabulary is None:
        bigrams, real = hashed_bigrams(token_ids, multiplier, num_buckets)  # (batch, seq - 1) each
    else:
        keys, real = bigram_keys(token_ids, vocabulary_size)  # (batch, seq - 1) each
        bigrams, known = sorted_index(keys, bigram_vocabulary)
        real = ops.logical_and(real, known)
    bigrams = ops.where(real, bigrams + vocabulary_size, ops.zeros_like(bigrams))
    return ops.concatenate([token_ids, bigrams], axis=1)  # (batch, 2 * seq - 1)


def checked_int32_ids(token_ids, vocabulary_size):
    """`token_ids` as int32 once every id is known to lie in `[0, vocabulary_size)` (`checked_ids`)."""
    return ops.cast(checked_ids("token_ids", token_ids, vocabulary_size, "vocabulary_size"), "int32")


def first_occurrences(features):
    """`(sorted, counted)`, both `(batch, n)`: the feature ids sorted, and True at the first
    occurrence of each real feature (not at repeats, padding or out-of-vocabulary)."""
    features = ops.sort(features, axis=-1)  # (batch, n)
    previous = ops.concatenate([ops.full_like(features[:, :1], -1), features[:, :-1]], axis=1)
    return features, ops.logical_and(features != previous, features >= FIRST_TOKEN_ID)


def hashed_bigrams(token_ids, multiplier, num_buckets):
    """`(buckets, real)`, both `(batch, seq - 1)`: the bucket `(a * multiplier + b) mod num_buckets`
    of each pair of neighbouring int32 token ids `a, b`, and whether both are real tokens (not
    padding or out-of-vocabulary)."""
    keys, real = bigram_keys(token_ids, multiplier)
    return ops.mod(keys, num_buckets), real


def bigram_keys(token_ids, multiplier):
    """`(keys, real)`, both `(batch, seq - 1)`: `a * multiplier + b` of each pair of neighbouring
    int32 token ids `a, b`, and whether both are real tokens. With `multiplier = vocabulary_size`
    distinct pairs get distinct keys."""
    first, second = token_ids[:, :-1], token_ids[:, 1:]  # (batch, seq - 1) each
    real = ops.logical_and(first >= FIRST_TOKEN_ID, second >= FIRST_TOKEN_ID)
    return first * multiplier + second, real


def sorted_index(keys, table):
    """`(index, found)`, both shaped as `keys`: the position of each key in the ascending int32
    `table` and whether it is there. A binary search of `log2(len(table))` gathers and comparisons,
    unrolled (no lookup-table op: it compiles under XLA and converts to ONNX)."""
    size = int(table.shape[0])
    below = ops.zeros_like(keys)  # how many entries of `table` are smaller than the key
    step = 1 << (size.bit_length() - 1)  # the largest power of two <= size
    while step:
        candidate = below + step
        smaller = ops.take(table, ops.minimum(candidate, size) - 1) < keys
        below = ops.where(ops.logical_and(candidate <= size, smaller), candidate, below)
        step >>= 1
    index = ops.minimum(below, size - 1)
    return index, ops.take(table, index) == keys


def _labelled_batches(data, labels, batch_size):
    """`(ids, labels)` batches from an array (with `labels` or None) or a dataset (labels from its
    pairs, else None)."""
    if not isinstance(data, np.ndarray):
        if labels is not None:
            raise ValueError(
                "`labels` goes with an array `data`; a dataset carries its labels as (ids, label) pairs. "
                f"Received: labels of {len(labels)} items and data={type(data).__name__}"
            )
        for batch in data:
            yield (batch[0], batch[1]) if isinstance(batch, tuple) else (batch, None)
        return
    if labels is not None:
        labels = np.asarray(labels)
        if len(labels) != len(data):
            raise ValueError(
                f"`labels` must hold one label per document of `data`. Received: {len(labels)} labels for "
                f"{len(data)} documents"
            )
    for start in range(0, len(data), batch_size):
        yield data[start : start + batch_size], None if labels is None else labels[start : start + batch_size]


def _binary_labels(labels):
    """`labels` as an int64 vector of 0/1: anything else is a `ValueError` naming it."""
    labels = np.asarray(labels).reshape(-1)
    if not np.all((labels == 0) | (labels == 1)):
        raise ValueError(
            f"`labels` must be 0 or 1. Received: labels holding {sorted(set(labels.tolist()) - {0, 1})[:5]}"
        )
    return labels.astype(np.int64)
