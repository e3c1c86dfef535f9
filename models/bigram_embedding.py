"""Hashed bigram embeddings: each position also sees the pair it starts, as fastText's n-grams."""

import keras
from keras import ops

from keras_attn.validation import check_positive_int
from models.ngram_bag import hashed_bigrams
from models.serialization import register_serializable


@register_serializable()
class HashedBigramEmbedding(keras.layers.Layer):
    """The embedding of the bigram `(token_i, token_i+1)` at each position `i`, hashed into buckets.

    Added to the token embeddings it makes the attention branch n-gram aware ("not good" is
    one feature, not two). A position whose pair holds padding or an out-of-vocabulary token,
    and the last position, get zeros. The hash is `models.ngram_bag.hashed_bigrams`'.

    Args:
        num_buckets: size of the hashed bigram space.
        output_dim: embedding width.
        multiplier: the hash multiplier (int32 arithmetic: see `NgramBag`).

    Call arguments:
        token_ids: int `(batch, seq)`.
        segment_ids: optional int `(batch, seq)` of packed rows (`pipelines.batching.pack_documents`):
            a pair across two documents is no bigram, as at the end of a document alone.

    Returns:
        `(batch, seq, output_dim)`, with the Keras mask of the real (non-padding) tokens.
    """

    def __init__(self, num_buckets, output_dim, multiplier=30_011, **kwargs):
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("output_dim", output_dim)
        super().__init__(**kwargs)
        self.num_buckets = num_buckets
        self.output_dim = output_dim
        self.multiplier = multiplier
        self.embedding = keras.layers.Embedding(num_buckets, output_dim, dtype=self.dtype_policy, name="bigrams")

    def build(self, input_shape):
        self.embedding.build((None,))

    def call(self, token_ids, segment_ids=None):
        buckets, real = hashed_bigrams(ops.cast(token_ids, "int32"), self.multiplier, self.num_buckets)
        if segment_ids is not None:
            real = ops.logical_and(real, ops.equal(segment_ids[:, :-1], segment_ids[:, 1:]))
        vectors = self.embedding(buckets) * ops.cast(ops.expand_dims(real, -1), self.compute_dtype)
        return ops.pad(vectors, ((0, 0), (0, 1), (0, 0)))  # (batch, seq, output_dim): none at the end

    def compute_mask(self, token_ids, segment_ids=None, mask=None):
        # The real tokens, as the token embedding's: added to it (`keras.layers.Add` keeps only the
        # masks its inputs carry), the sum keeps the padding mask the encoder blocks attend with.
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, token_ids_shape, segment_ids_shape=None):
        return (*token_ids_shape, self.output_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "num_buckets": self.num_buckets,
            "output_dim": self.output_dim,
            "multiplier": self.multiplier,
        }
