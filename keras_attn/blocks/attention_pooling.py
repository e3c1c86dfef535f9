"""Attention pooling: a learnt query attends over the sequence (Set Transformer's PMA with one seed)."""

import keras
from keras import ops

from keras_attn.blocks.documents import token_documents
from keras_attn.core.masks import zero_masked
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.utils import as_float_inputs
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import nan_unless
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class AttentionPooling(keras.layers.Layer):
    """Pools `(batch, seq, features)` to `(batch, features)` by multi-head attention from a learnt query; per document of packed rows.

    Where `MaskedGlobalPooling` weighs every real position alike, here each head learns which
    positions to read: one trainable query vector attends over the sequence (keys and values
    are the inputs), as the pooling of Set Transformer (Lee et al., 2019, PMA with one seed
    vector) and of attention-pooled classifiers. The attention is `keras_attn.MultiHeadAttention`,
    so padding is masked exactly, and a sequence with no real position pools to exact zeros
    (never NaN).

    With `segment_ids` (rows packed with several documents, `keras_attn.packing.pack`), the
    query reads each document alone: the output holds one vector per document, `(batch,
    max_documents, features)`, document `s` of a row at index `s - 1`, equal to pooling that
    document by itself.

    Args:
        num_heads: attention heads.
        key_dim: size of each head's query and key.
        dropout: dropout on the attention weights.
        max_documents: the most documents a packed row holds (the size of the output's document
            axis); needed to call with `segment_ids`.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`.
        mask: optional boolean `(batch, seq)`, `True` for real positions; taken from the Keras
            mask of the inputs (`Embedding(mask_zero=True)` upstream) when not given.
        segment_ids: optional int `(batch, seq)`: each position's document `1..max_documents`
            within its row, `0` for padding.
        training: whether the attention dropout is on.

    Returns:
        `(batch, features)`, or `(batch, max_documents, features)` with `segment_ids`, in the
        compute dtype; a document with no real position pools to zeros. The output carries no mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 16, mask_zero=True)(tokens)
    >>> tuple(AttentionPooling(num_heads=2, key_dim=8)(x).shape)
    (None, 16)

    One vector per document of packed rows of 6 tokens holding up to 3 documents:

    >>> segment_ids = ops.convert_to_tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    >>> pooling = AttentionPooling(num_heads=2, key_dim=8, max_documents=3)
    >>> tuple(pooling(keras.random.normal((2, 6, 16)), segment_ids=segment_ids).shape)
    (2, 3, 16)
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, max_documents=None, **kwargs):
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_rate("dropout", dropout)
        check_positive_int("max_documents", max_documents, allow_none=True)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.max_documents = max_documents
        self.supports_masking = True
        self.attention = MultiHeadAttention(
            num_heads, key_dim, dropout=dropout, dtype=self.dtype_policy, name="attention"
        )

    def build(self, input_shape):
        check_sequence_shape("inputs", input_shape)
        features = input_shape[-1]
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: features}, name="inputs")  # checked at every call
        self.query = self.add_weight(shape=(1, 1, features), initializer="glorot_uniform", name="query")
        self.attention.build((None, 1, features), (None, None, features))

    def call(self, inputs, mask=None, segment_ids=None, training=None):
        check_padding_mask("mask", mask, inputs.shape)
        inputs = as_float_inputs(inputs, self.compute_dtype)  # not the query cast to ints: as Keras's layers
        documents, count, valid = token_documents(inputs, mask, segment_ids, self.max_documents)
        slots = ops.arange(1, count + 1, dtype="int32")[None, :, None]  # (1, count, 1)
        reads = ops.equal(ops.expand_dims(documents, 1), slots)  # (batch, count, seq): query d reads document d
        batch = ops.shape(inputs)[0]
        query = ops.broadcast_to(
            ops.cast(self.query, inputs.dtype), (batch, count, inputs.shape[-1])
        )  # (batch, count, features): the same learnt query for each document
        pooled = self.attention(query, inputs, attention_mask=reads, training=training)
        # A document with no real position reads nothing: zeros, not the output projection's bias.
        pooled = zero_masked(pooled, ops.any(reads, axis=2, keepdims=True))
        pooled = nan_unless(valid, pooled)
        return pooled if segment_ids is not None else pooled[:, 0]

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape, segment_ids_shape=None):
        if segment_ids_shape is None:
            return (inputs_shape[0], inputs_shape[-1])
        return (inputs_shape[0], self.max_documents, inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "max_documents": self.max_documents,
            }
        )
        return config
