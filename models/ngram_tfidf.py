"""TF-IDF features of token unigrams and hashed bigrams, computed in the graph from token ids."""

import keras
import numpy as np
from keras import ops

from keras_attn.validation import check_positive_int
from keras_attn.utils import checked_ids
from models.serialization import register_serializable
from models.vocabulary import FIRST_TOKEN_ID


@register_serializable()
class NgramTfIdf(keras.layers.Layer):
    """TF-IDF vector (norm `scale`) of the unigrams and hashed bigrams of each token-id sequence, sparse.

    Feature `t < vocabulary_size` is the token id `t`; feature `vocabulary_size + h` is the
    bigram of neighbouring tokens `a, b` with `h = (a * multiplier + b) mod num_buckets`. Term
    frequencies are binary (present or not) and the inverse document frequencies smooth, as
    scikit-learn's `TfidfVectorizer(binary=True)`: `idf = log((1 + n) / (1 + df)) + 1`, learnt by
    `adapt` from the training documents. Padding and out-of-vocabulary tokens, and bigrams that
    contain one, are not features. The vector is L2-normalised and multiplied by `scale`.

    The output is sparse, a pair `(features, values)`: every unigram and bigram position's feature
    id, sorted, and its TF-IDF value at its first occurrence (0 at repeats and non-features).
    `SparseLinear` on top is a bag-of-n-grams logistic regression, the classic strong baseline of
    sentiment classification (Wang & Manning, 2012), at the cost of the review's length rather
    than of the feature space: a sort, a gather, no `(batch, num_features)` tensor, under XLA and
    in ONNX Runtime alike.

    Args:
        vocabulary_size: token ids are in `[0, vocabulary_size)`.
        num_buckets: size of the hashed bigram space.
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

    >>> layer = NgramTfIdf(vocabulary_size=10, num_buckets=16)
    >>> layer.adapt(np.array([[2, 3, 4, 0], [2, 5, 0, 0]]))
    >>> features, values = layer(np.array([[2, 3, 4, 5]]))  # (1, 7) each
    >>> round(float(keras.ops.sum(values**2)), 4)
    1.0
    """

    def __init__(self, vocabulary_size, num_buckets, multiplier=30_011, scale=1.0, **kwargs):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("multiplier", multiplier)
        if not scale > 0:
            raise ValueError(f"`scale` must be positive. Received: scale={scale!r}")
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.num_buckets = num_buckets
        self.multiplier = multiplier
        self.scale = scale
        self.num_features = vocabulary_size + num_buckets
        self.idf = self.add_weight(
            shape=(self.num_features,), initializer="ones", trainable=False, dtype="float32", name="idf"
        )

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}"
            )

    def feature_ids(self, token_ids):
        """Feature ids `(batch, 2 * seq - 1)` of every unigram and bigram; 0 where none."""
        token_ids = checked_ids("token_ids", token_ids, self.vocabulary_size, "vocabulary_size")
        token_ids = ops.cast(token_ids, "int32")
        bigrams, real = hashed_bigrams(token_ids, self.multiplier, self.num_buckets)  # (batch, seq - 1) each
        bigrams = ops.where(real, bigrams + self.vocabulary_size, ops.zeros_like(bigrams))
        return ops.concatenate([token_ids, bigrams], axis=1)  # (batch, 2 * seq - 1)

    def first_occurrences(self, token_ids):
        """Sorted feature ids `(batch, 2 * seq - 1)` and where each feature is counted (once)."""
        features = ops.sort(self.feature_ids(token_ids), axis=-1)  # (batch, 2 * seq - 1)
        previous = ops.concatenate([ops.full_like(features[:, :1], -1), features[:, :-1]], axis=1)
        return features, ops.logical_and(features != previous, features >= FIRST_TOKEN_ID)

    def call(self, token_ids):
        features, counted = self.first_occurrences(token_ids)  # (batch, 2 * seq - 1) each
        tfidf = ops.where(counted, ops.take(self.idf, features), ops.zeros((), "float32"))  # (batch, 2 * seq - 1)
        norm = ops.sqrt(ops.maximum(ops.sum(tfidf * tfidf, axis=-1, keepdims=True), 1e-12))  # (batch, 1)
        return features, tfidf * (self.scale / norm)

    def densify(self, features, values):
        """The dense TF-IDF vectors `(batch, num_features)` of `call`'s sparse output (for tests)."""
        one_hot = ops.one_hot(features, self.num_features)  # (batch, 2 * seq - 1, num_features)
        return ops.einsum("bn,bnf->bf", values, one_hot)

    def adapt(self, data, batch_size=256):
        """Learns the inverse document frequencies from documents of token ids.

        Args:
            data: an int array `(documents, seq)` or a dataset of `(batch, seq)` id batches (or of
                `(ids, label)` pairs), the training documents only.
            batch_size: documents counted at once when `data` is an array.
        """
        document_frequency = np.zeros(self.num_features, np.float64)
        documents = 0
        for batch in _batches(data, batch_size):
            features, counted = (ops.convert_to_numpy(t) for t in self.first_occurrences(batch))
            np.add.at(document_frequency, features[counted], 1.0)  # each feature once per document
            documents += features.shape[0]
        if documents == 0:
            raise ValueError(f"`data` holds no documents. Received: data={data!r}")
        idf = np.log((1.0 + documents) / (1.0 + document_frequency)) + 1.0
        self.idf.assign(idf.astype("float32"))

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
                "multiplier": self.multiplier,
                "scale": self.scale,
            }
        )
        return config


def hashed_bigrams(token_ids, multiplier, num_buckets):
    """`(buckets, real)`, both `(batch, seq - 1)`: the bucket `(a * multiplier + b) mod num_buckets`
    of each pair of neighbouring int32 token ids `a, b`, and whether both are real tokens (not
    padding or out-of-vocabulary)."""
    first, second = token_ids[:, :-1], token_ids[:, 1:]  # (batch, seq - 1) each
    real = ops.logical_and(first >= FIRST_TOKEN_ID, second >= FIRST_TOKEN_ID)
    return ops.mod(first * multiplier + second, num_buckets), real


def _batches(data, batch_size):
    """`(batch, seq)` id arrays or tensors from an array or a dataset (labels dropped)."""
    if isinstance(data, np.ndarray):
        for start in range(0, len(data), batch_size):
            yield data[start : start + batch_size]
        return
    for batch in data:
        yield batch[0] if isinstance(batch, tuple) else batch
