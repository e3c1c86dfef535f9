"""Weighted bags of token unigrams and hashed bigrams, computed in the graph from token ids."""

import keras
import numpy as np
from keras import ops

from keras_attn.validation import check_choice
from keras_attn.validation import check_positive_int
from keras_attn.utils import checked_ids
from models.serialization import register_serializable
from models.vocabulary import FIRST_TOKEN_ID

# How `NgramBag.adapt` weighs each feature (see the class docstring).
WEIGHTINGS = ("idf", "naive_bayes")


@register_serializable()
class NgramBag(keras.layers.Layer):
    """Weighted bag (norm `scale`) of the unigrams and hashed bigrams of each token-id sequence, sparse.

    Feature `t < vocabulary_size` is the token id `t`; feature `vocabulary_size + h` is the
    bigram of neighbouring tokens `a, b` with `h = (a * multiplier + b) mod num_buckets`. A
    feature's value is binary (present or not) times its weight, learnt by `adapt` from the
    training documents:

    - "idf": the smooth inverse document frequency of scikit-learn's
      `TfidfVectorizer(binary=True)`, `log((1 + n) / (1 + df)) + 1`: a TF-IDF vector;
    - "naive_bayes": the log-count ratio of Wang & Manning's NBSVM (2012), `r = log((p / |p|) /
      (q / |q|))` with `p = 1 + (documents of label 1 holding the feature)` and `q` the same for
      label 0: the evidence of the feature for label 1 under naive Bayes (needs the labels).
      A logistic regression on these values is NBSVM's NB-LR; on IMDB it beats the TF-IDF one
      (README, the main job).

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
        num_buckets: size of the hashed bigram space.
        weighting: one of `WEIGHTINGS`, what `adapt` learns.
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

    def __init__(self, vocabulary_size, num_buckets, weighting="idf", multiplier=30_011, scale=1.0, **kwargs):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_buckets", num_buckets)
        check_choice("weighting", weighting, WEIGHTINGS)
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
        self.num_features = vocabulary_size + num_buckets
        self.feature_weights = self.add_weight(
            shape=(self.num_features,), initializer="ones", trainable=False, dtype="float32", name="feature_weights"
        )

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}"
            )

    def feature_ids(self, token_ids):
        """Feature ids `(batch, 2 * seq - 1)` of every unigram and bigram; 0 where none."""
        return ngram_feature_ids(token_ids, self.vocabulary_size, self.num_buckets, self.multiplier)

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
        """Learns the feature weights (`weighting`) from the training documents only.

        Args:
            data: an int array `(documents, seq)` of token ids, or a dataset of `(batch, seq)` id
                batches or of `(ids, label)` pairs.
            labels: 0/1 array `(documents,)` beside an array `data`; "naive_bayes" needs labels,
                from here or from the dataset's pairs.
            batch_size: documents counted at once when `data` is an array.
        """
        # Documents holding each feature (once per document), by label.
        counts = {label: np.zeros(self.num_features, np.float64) for label in (0, 1)}
        documents = 0
        for batch, batch_labels in _labelled_batches(data, labels, batch_size):
            features, counted = (ops.convert_to_numpy(t) for t in self.first_occurrences(batch))
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
        self.feature_weights.assign(weights.astype("float32"))

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
            }
        )
        return config


def ngram_feature_ids(token_ids, vocabulary_size, num_buckets, multiplier):
    """Feature ids `(batch, 2 * seq - 1)` of every unigram and bigram of the token ids, once every id
    is known to lie in `[0, vocabulary_size)` (`checked_ids`): the token ids, then
    `vocabulary_size +` each bigram's bucket; 0 where a bigram holds padding or an
    out-of-vocabulary token."""
    token_ids = ops.cast(checked_ids("token_ids", token_ids, vocabulary_size, "vocabulary_size"), "int32")
    bigrams, real = hashed_bigrams(token_ids, multiplier, num_buckets)  # (batch, seq - 1) each
    bigrams = ops.where(real, bigrams + vocabulary_size, ops.zeros_like(bigrams))
    return ops.concatenate([token_ids, bigrams], axis=1)  # (batch, 2 * seq - 1)


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
    first, second = token_ids[:, :-1], token_ids[:, 1:]  # (batch, seq - 1) each
    real = ops.logical_and(first >= FIRST_TOKEN_ID, second >= FIRST_TOKEN_ID)
    return ops.mod(first * multiplier + second, num_buckets), real


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
        raise ValueError(f"`labels` must be 0 or 1. Received: labels holding {sorted(set(labels.tolist()) - {0, 1})[:5]}")
    return labels.astype(np.int64)
