"""Token embeddings that carry n-gram evidence: unigram + hashed-bigram vectors, each scaled by the
n-gram bag's feature weight (its naive-Bayes log-count ratio)."""

import keras
from keras import ops

from keras_attn.validation import check_positive_int
from models.ngram_bag import FIRST_TOKEN_ID
from models.ngram_bag import hashed_bigrams
from models.serialization import register_serializable


@register_serializable()
class WeightedNgramEmbedding(keras.layers.Layer):
    """At each position `i`: `w[t_i] * U[t_i] + w[V + b_i] * B[b_i]`, with `b_i` the hashed bigram
    `(t_i, t_i+1)`.

    `U` and `B` are learnt unigram and bigram tables; `w` holds one fixed weight per feature,
    indexed as `NgramBag`'s features (unigrams, then `vocabulary_size +` the bigram bucket, the
    same hash): copy a trained bag's `feature_weights` in (`models.sentiment_classifier.adapt_ngram_weights`)
    and each position's vector is its n-grams' embeddings weighted by their naive-Bayes
    log-count ratios, so an attention over positions reads the sentiment evidence of each
    n-gram ("not good" is one feature, with its sign and strength). Padding, out-of-vocabulary
    tokens and bigrams holding them contribute zeros; the output's Keras mask keeps the non-padding
    positions.

    Args:
        vocabulary_size: token vocabulary, padding (0) and OOV (1) included.
        num_buckets: size of the hashed bigram space.
        output_dim: embedding width.
        multiplier: the bigram hash multiplier (int32 arithmetic: see `NgramBag`).

    Call arguments:
        token_ids: int `(batch, seq)`, 0 = padding.

    Returns:
        `(batch, seq, output_dim)`.
    """

    def __init__(self, vocabulary_size, num_buckets, output_dim, multiplier=30_011, **kwargs):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("output_dim", output_dim)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.num_buckets = num_buckets
        self.output_dim = output_dim
        self.multiplier = multiplier
        initializer = keras.initializers.RandomNormal(stddev=0.05)
        self.unigrams = keras.layers.Embedding(vocabulary_size, output_dim, initializer, dtype=self.dtype_policy, name="unigrams")
        self.bigrams = keras.layers.Embedding(num_buckets, output_dim, initializer, dtype=self.dtype_policy, name="bigrams")
        self.feature_weights = self.add_weight(
            shape=(vocabulary_size + num_buckets,), initializer="ones", trainable=False, dtype="float32", name="feature_weights"
        )

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}")
        self.unigrams.build((None,))
        self.bigrams.build((None,))

    def call(self, token_ids):
        token_ids = ops.cast(token_ids, "int32")  # (batch, seq)
        buckets, real = hashed_bigrams(token_ids, self.multiplier, self.num_buckets)  # (batch, seq - 1) each
        buckets = ops.pad(buckets, ((0, 0), (0, 1)))  # (batch, seq): the last position starts no bigram
        real = ops.pad(real, ((0, 0), (0, 1)))
        unigram_weight = ops.where(token_ids >= FIRST_TOKEN_ID, ops.take(self.feature_weights, token_ids), 0.0)
        bigram_weight = ops.where(real, ops.take(self.feature_weights, buckets + self.vocabulary_size), 0.0)
        unigram_weight = ops.cast(ops.expand_dims(unigram_weight, -1), self.compute_dtype)  # (batch, seq, 1)
        bigram_weight = ops.cast(ops.expand_dims(bigram_weight, -1), self.compute_dtype)
        return self.unigrams(token_ids) * unigram_weight + self.bigrams(buckets) * bigram_weight

    def compute_mask(self, token_ids, mask=None):
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "num_buckets": self.num_buckets,
            "output_dim": self.output_dim,
            "multiplier": self.multiplier,
        }
