"""Token embedding plus position embedding, the input block of a Transformer."""

import math

import keras
from keras import ops

from keras_attn.positions.position_embedding import PositionEmbedding
from keras_attn.positions.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.utils import check_leading_sizes
from keras_attn.utils import checked_ids
from keras_attn.utils import clone_initializer
from keras_attn.utils import nan_unless
from keras_attn.utils import valid_ids
from keras_attn.validation import check_bool
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int

_POSITION_ENCODINGS = ("learned", "sinusoidal")
PADDING_ID = 0  # the token id that `mask_zero=True` masks: every model's vocabulary reserves it


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Embeds token ids and adds their position embedding.

    `output[b, t] = token_embedding(ids[b, t]) * (sqrt(embedding_dim) if scale_embeddings)
    + position(start_index + t)` (or of the given `positions`, or of positions restarting per
    document with `segment_ids`), with learned positions (`PositionEmbedding`, at most
    `sequence_length` of them) or fixed sinusoids (`SinusoidalPositionEncoding`, any length).
    With `mask_zero=True` id 0 is padding: the output carries the Keras mask `ids != 0`, which
    mask-aware layers downstream (`TransformerEncoder`, `MultiHeadAttention`, pooling) use.
    The token table is exposed as `.token_embedding` (a `keras.layers.Embedding`) so that an
    output projection can share its weights.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: maximum number of positions for `position_encoding="learned"`; may
            be `None` with `"sinusoidal"` (no maximum).
        embedding_dim: width of the embeddings.
        mask_zero: whether id 0 is padding (produces a Keras mask).
        position_encoding: `"learned"` or `"sinusoidal"`.
        embeddings_initializer: initializer of the token (and learned position) tables.
        scale_embeddings: multiply the token embeddings by `sqrt(embedding_dim)` before adding
            positions (Vaswani et al., 2017).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        token_ids: integer `(batch, seq)` ids in `[0, vocabulary_size)`. An id out of range
            is a `ValueError` naming `token_ids` and the id when called eagerly, and fails a
            run-time assertion (`InvalidArgumentError`) in `tf.function`; under XLA
            (`jit_compile=True`), which drops assertions, the whole output is NaN
            (tests/test_attention_edge_inputs.py pins both).
        start_index: int or scalar int tensor, the position of the first token (cached
            decoding feeds one token at a time).
        positions: optional int `(batch, seq)`, the position of every token instead.
        segment_ids: optional int `(batch, seq)` documents of a packed row (0 for padding):
            positions restart at 0 in each document (`keras_attn.document_positions`), so each
            document is embedded as it is alone. At most one of `start_index` (non-zero),
            `positions` and `segment_ids` (as `PositionEmbedding` / `SinusoidalPositionEncoding`).

    Returns:
        `(batch, seq, embedding_dim)`.

    Example:

    >>> ids = keras.Input((None,), dtype="int32")
    >>> x = TokenAndPositionEmbedding(1000, 128, 64)(ids)  # carries the mask ids != 0
    >>> tuple(x.shape)
    (None, None, 64)

    A packed row: two documents, then padding; each document is embedded as it is alone.

    >>> packed_ids = keras.ops.convert_to_tensor([[5, 6, 7, 8, 9, 0]])
    >>> segment_ids = keras.ops.convert_to_tensor([[1, 1, 1, 2, 2, 0]])  # positions 0 1 2 0 1 0
    >>> embed = TokenAndPositionEmbedding(1000, 128, 64)
    >>> packed = embed(packed_ids, segment_ids=segment_ids)
    >>> bool(keras.ops.all(packed[0, 3:5] == embed(packed_ids[:, 3:5])[0]))
    True
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        mask_zero=True,
        position_encoding="learned",
        embeddings_initializer="uniform",
        scale_embeddings=False,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("embedding_dim", embedding_dim)
        check_elements("The token embedding table", vocabulary_size=vocabulary_size, embedding_dim=embedding_dim)
        check_bool("mask_zero", mask_zero)
        check_bool("scale_embeddings", scale_embeddings)
        if position_encoding not in _POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {_POSITION_ENCODINGS}. "
                f"Received: position_encoding={position_encoding!r}"
            )
        check_positive_int("sequence_length", sequence_length, allow_none=position_encoding == "sinusoidal")
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.embedding_dim = embedding_dim
        self.mask_zero = mask_zero
        self.position_encoding = position_encoding
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.scale_embeddings = scale_embeddings
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size,
            embedding_dim,
            embeddings_initializer=clone_initializer(self.embeddings_initializer),
            mask_zero=mask_zero,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        if position_encoding == "learned":
            self.position_embedding = PositionEmbedding(
                sequence_length,
                initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding(dtype=self.dtype_policy, name="position_embedding")

    def build(self, token_ids_shape):
        if len(token_ids_shape) != 2:
            raise ValueError(
                f"`token_ids` must have rank 2 (batch, seq). Received: token_ids.shape={tuple(token_ids_shape)}"
            )
        self.input_spec = keras.layers.InputSpec(ndim=2, name="token_ids")  # checked at every call
        self.token_embedding.build(token_ids_shape)
        self.position_embedding.build((*token_ids_shape, self.embedding_dim))

    def call(self, token_ids, start_index=0, positions=None, segment_ids=None):
        token_ids = checked_ids("token_ids", token_ids, self.vocabulary_size, "vocabulary_size")
        check_leading_sizes("token_ids", 2, token_ids=token_ids, positions=positions, segment_ids=segment_ids)
        embedded = nan_unless(valid_ids(token_ids, self.vocabulary_size), self.token_embedding(token_ids))
        if self.scale_embeddings:
            embedded = embedded * ops.cast(math.sqrt(self.embedding_dim), self.compute_dtype)
        where = dict(start_index=start_index, positions=positions, segment_ids=segment_ids)
        if self.position_encoding == "learned":
            return embedded + self.position_embedding(embedded, **where)
        return self.position_embedding(embedded, **where)  # adds the sinusoids

    def compute_mask(self, token_ids, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, PADDING_ID)

    def compute_output_shape(self, token_ids_shape):
        return (*token_ids_shape, self.embedding_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "sequence_length": self.sequence_length,
                "embedding_dim": self.embedding_dim,
                "mask_zero": self.mask_zero,
                "position_encoding": self.position_encoding,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "scale_embeddings": self.scale_embeddings,
            }
        )
        return config
