"""Embeddings of a review's distinct n-grams, each scaled by the n-gram bag's feature weight (its
naive-Bayes log-count ratio): the set an attention pools, as NBSVM's bag counts it."""

import keras
from keras import ops

from keras_attn.validation import check_positive_int
from models.ngram_bag import add_bigram_vocabulary
from models.ngram_bag import check_bigram_ids
from models.ngram_bag import first_occurrences
from models.ngram_bag import ngram_feature_ids
from models.serialization import register_serializable


@register_serializable()
class WeightedNgramEmbedding(keras.layers.Layer):
    """One slot per unigram and bigram feature of the review, `w[f] * E[f]` at the first
    occurrence of each feature `f` and zeros elsewhere, with the mask of those first occurrences.

    Features are `NgramBag`'s (the token id, then `vocabulary_size +` the bigram's bucket by the
    same hash, or its index in the same bigram vocabulary), in the same sorted order: each distinct
    n-gram counts once however often the review repeats it, as in NBSVM's binarised bag. `E` is a
    learnt table, one row per feature; `w` holds one fixed weight per feature: copy a trained bag's
    `feature_weights` (and `bigram_vocabulary`) in (`models.sentiment_classifier.adapt_ngram_weights`)
    and each slot is its n-gram's embedding
    weighted by its naive-Bayes log-count ratio, so an attention over the slots reads the
    sentiment evidence of each n-gram ("not good" is one feature, with its sign and strength).
    Padding, out-of-vocabulary tokens and bigrams holding them are no feature.

    Distinct n-grams rather than one vector per position (each position's unigram plus the bigram
    it starts): pooled per position, a phrase repeated through a review would weigh once per
    repeat (the IMDB model card's ablation compares the two).

    Args:
        vocabulary_size: token vocabulary, padding (0) and OOV (1) included.
        num_buckets: size of the bigram feature space: hash buckets, or bigrams in the vocabulary.
        output_dim: embedding width.
        multiplier: the bigram hash multiplier (int32 arithmetic: see `NgramBag`).
        bigram_ids: one of `models.ngram_bag.BIGRAM_IDS`, as `NgramBag`'s.

    Call arguments:
        token_ids: int `(batch, seq)` in `[0, vocabulary_size)`, 0 = padding.

    Returns:
        `(embeddings, counted)`: float `(batch, 2 * seq - 1, output_dim)` and bool `(batch, 2 * seq - 1)`,
        True at the slots that hold a feature. The mask is an output, not a Keras mask: it falls
        out of the sort that finds the distinct features, and a `compute_mask` would sort again
        (in a functional model Keras records it as extra ops). Pass it on:
        `AttentionPooling(...)(embeddings, mask=counted)`.
    """

    def __init__(self, vocabulary_size, num_buckets, output_dim, multiplier=30_011, bigram_ids="hashed", **kwargs):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("output_dim", output_dim)
        check_bigram_ids(bigram_ids, vocabulary_size)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.num_buckets = num_buckets
        self.output_dim = output_dim
        self.multiplier = multiplier
        self.bigram_ids = bigram_ids
        self.embeddings = keras.layers.Embedding(
            vocabulary_size + num_buckets,
            output_dim,
            keras.initializers.RandomNormal(stddev=0.05),
            dtype=self.dtype_policy,
            name="embeddings",
        )
        self.feature_weights = self.add_weight(
            shape=(vocabulary_size + num_buckets,),
            initializer="ones",
            trainable=False,
            dtype="float32",
            name="feature_weights",
        )
        self.bigram_vocabulary = add_bigram_vocabulary(self) if bigram_ids == "vocabulary" else None

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}"
            )
        self.embeddings.build((None,))

    def call(self, token_ids):
        features, counted = first_occurrences(
            ngram_feature_ids(
                token_ids, self.vocabulary_size, self.num_buckets, self.multiplier, self.bigram_vocabulary
            )
        )  # (batch, 2 * seq - 1) each, as `NgramBag.first_occurrences`
        weights = ops.where(counted, ops.take(self.feature_weights, features), 0.0)
        weights = ops.cast(ops.expand_dims(weights, -1), self.compute_dtype)  # (batch, 2 * seq - 1, 1)
        return self.embeddings(features) * weights, counted

    def compute_output_spec(self, token_ids):
        length = None if token_ids.shape[1] is None else max(2 * token_ids.shape[1] - 1, 0)
        return (
            keras.KerasTensor((token_ids.shape[0], length, self.output_dim), self.compute_dtype),
            keras.KerasTensor((token_ids.shape[0], length), "bool"),
        )

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "num_buckets": self.num_buckets,
            "output_dim": self.output_dim,
            "multiplier": self.multiplier,
            "bigram_ids": self.bigram_ids,
        }
