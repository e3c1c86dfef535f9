"""Embeddings of hashed token bigrams, computed in the graph from token ids."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attn_models")
class HashedBigramEmbedding(keras.layers.Layer):
    """Embeds each pair of neighbouring tokens through a hashed id (a bag-of-bigrams feature).

    For token ids `a = ids[:, i]` and `b = ids[:, i + 1]` the bigram id is
    `(a * multiplier + b) mod num_buckets`, computed with integer ops only (so the layer
    exports to ONNX and runs under XLA). A bigram is real when both tokens are real (non-zero);
    the output carries that mask, so `MaskedGlobalPooling` upstream of a dense head gives a
    fastText-style bag of bigrams.

    Args:
        num_buckets: size of the hashed bigram vocabulary (rows of the embedding table).
        output_dim: embedding size.
        multiplier: the hash multiplier, an odd prime (so `a * multiplier` spreads over every
            residue of a power-of-two `num_buckets`). `a * multiplier + b` must stay below
            2**31 for every token id (int32 arithmetic): with the default, token vocabularies
            up to 71,000.
        embeddings_initializer: initializer of the table.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        token_ids: int `(batch, seq)`, 0 = padding.

    Returns:
        `(batch, seq - 1, output_dim)`, with a boolean mask `(batch, seq - 1)`.

    Example:

    >>> ids = keras.Input((None,), dtype="int32")
    >>> bigrams = HashedBigramEmbedding(num_buckets=2**18, output_dim=32)(ids)
    >>> bag = keras_attn.MaskedGlobalPooling("mean")(bigrams)  # (batch, 32)
    """

    def __init__(self, num_buckets, output_dim, multiplier=30_011, embeddings_initializer="uniform", **kwargs):
        for name, value in (("num_buckets", num_buckets), ("output_dim", output_dim), ("multiplier", multiplier)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        super().__init__(**kwargs)
        self.num_buckets = num_buckets
        self.output_dim = output_dim
        self.multiplier = multiplier
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embedding = keras.layers.Embedding(
            num_buckets,
            output_dim,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="bigram_embedding",
        )

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(input_shape)}"
            )
        self.embedding.build(input_shape)

    def bigram_ids(self, token_ids):
        """Hashed bigram ids `(batch, seq - 1)` (int32) and their mask (both tokens real)."""
        token_ids = ops.cast(token_ids, "int32")
        first, second = token_ids[:, :-1], token_ids[:, 1:]  # (batch, seq - 1) each
        hashed = ops.mod(first * self.multiplier + second, self.num_buckets)  # (batch, seq - 1)
        mask = ops.logical_and(ops.not_equal(first, 0), ops.not_equal(second, 0))  # (batch, seq - 1)
        return hashed, mask

    def call(self, token_ids):
        hashed, _ = self.bigram_ids(token_ids)
        return self.embedding(hashed)  # (batch, seq - 1, output_dim)

    def compute_mask(self, token_ids, mask=None):
        return self.bigram_ids(token_ids)[1]

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else max(input_shape[1] - 1, 0)
        return (input_shape[0], length, self.output_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "output_dim": self.output_dim,
                "multiplier": self.multiplier,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
