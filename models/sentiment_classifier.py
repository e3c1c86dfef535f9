"""The IMDB sentiment classifier: token ids in, positive-class probability out.

Built from keras_attn layers: `TokenAndPositionEmbedding` (with the padding mask), `num_layers`
`TransformerEncoder` blocks, `MaskedGlobalPooling` over the real tokens (mean, max or both), and
optionally a hashed-bigram bag (`HashedBigramEmbedding` + masked mean), concatenated into a
small dense head. Tokenisation happens outside the model (in `tf.data`, or in the serving
function), so the model compiles with XLA and converts to ONNX.
"""

import dataclasses

import keras

from keras_attn import MaskedGlobalPooling
from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerEncoder
from models.hashed_bigram_embedding import HashedBigramEmbedding

_POOLING_MODES = ("mean", "max")


@dataclasses.dataclass(frozen=True)
class SentimentClassifierConfig:
    """Sizes of the classifier; the defaults are the configuration the README reports.

    Attributes:
        vocabulary_size: token vocabulary, padding (0) and OOV (1) included.
        sequence_length: longest token sequence (reviews are truncated to it).
        embedding_dim: width of the token embeddings and encoder blocks.
        num_layers: number of `TransformerEncoder` blocks.
        num_heads: attention heads per block.
        intermediate_dim: hidden size of each block's feed-forward network.
        dropout: dropout in the blocks and before the head.
        pooling: pooling modes over real tokens concatenated: any of "mean", "max".
        position_encoding: "learned" or "sinusoidal".
        bigram_buckets: rows of the hashed bigram table; 0 turns the bigram bag off.
        bigram_dim: width of the bigram embeddings.
    """

    vocabulary_size: int = 20_000
    sequence_length: int = 512
    embedding_dim: int = 64
    num_layers: int = 1
    num_heads: int = 4
    intermediate_dim: int = 128
    dropout: float = 0.1
    pooling: tuple = ("mean", "max")
    position_encoding: str = "learned"
    bigram_buckets: int = 2**18
    bigram_dim: int = 32

    def __post_init__(self):
        if not self.pooling or any(mode not in _POOLING_MODES for mode in self.pooling):
            raise ValueError(
                f"`pooling` must be a non-empty sequence of {_POOLING_MODES}. Received: pooling={self.pooling!r}"
            )
        if self.bigram_buckets < 0:
            raise ValueError(f"`bigram_buckets` must be >= 0. Received: bigram_buckets={self.bigram_buckets}")

    def to_dict(self):
        return {**dataclasses.asdict(self), "pooling": list(self.pooling)}

    @classmethod
    def from_dict(cls, values):
        return cls(**{**values, "pooling": tuple(values["pooling"])})


def build_sentiment_classifier(config=SentimentClassifierConfig()):
    """The classifier as a functional `keras.Model`: int token ids `(batch, seq)` -> `(batch, 1)` probability.

    Args:
        config: a `SentimentClassifierConfig`.

    Returns:
        A `keras.Model` named "sentiment_classifier" with one input `token_ids` (int32,
        0 = padding) and one float32 output `probability`, the positive-class probability.
    """
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = TokenAndPositionEmbedding(
        config.vocabulary_size,
        config.sequence_length,
        config.embedding_dim,
        mask_zero=True,
        position_encoding=config.position_encoding,
        name="token_and_position_embedding",
    )(token_ids)  # (batch, seq, embedding_dim)
    hidden = keras.layers.Dropout(config.dropout, name="embedding_dropout")(hidden)
    for index in range(config.num_layers):
        hidden = TransformerEncoder(
            config.intermediate_dim, config.num_heads, dropout=config.dropout, name=f"encoder_{index}"
        )(hidden)  # (batch, seq, embedding_dim)
    features = [MaskedGlobalPooling(mode, name=f"{mode}_pooling")(hidden) for mode in config.pooling]
    if config.bigram_buckets:
        bigrams = HashedBigramEmbedding(
            config.bigram_buckets, config.bigram_dim, name="hashed_bigrams"
        )(token_ids)  # (batch, seq - 1, bigram_dim)
        features.append(MaskedGlobalPooling("mean", name="bigram_pooling")(bigrams))
    features = features[0] if len(features) == 1 else keras.layers.Concatenate(name="features")(features)
    features = keras.layers.Dropout(config.dropout, name="head_dropout")(features)
    probability = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="probability")(
        features
    )  # (batch, 1)
    return keras.Model(token_ids, probability, name="sentiment_classifier")
