"""Attention pooling: a learnt query attends over the sequence (Set Transformer's PMA with one seed)."""

import keras
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_sequence_shape
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class AttentionPooling(keras.layers.Layer):
    """Pools `(batch, seq, features)` to `(batch, features)` by multi-head attention from a learnt query.

    Where `MaskedGlobalPooling` weighs every real position alike, here each head learns which
    positions to read: one trainable query vector attends over the sequence (keys and values
    are the inputs), as the pooling of Set Transformer (Lee et al., 2019, PMA with one seed
    vector) and of attention-pooled classifiers. The attention is `keras_attn.MultiHeadAttention`,
    so padding is masked exactly, and a sequence with no real position pools to exact zeros
    (never NaN).

    Args:
        num_heads: attention heads.
        key_dim: size of each head's query and key.
        dropout: dropout on the attention weights.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`.
        mask: optional boolean `(batch, seq)`, `True` for real positions; taken from the Keras
            mask of the inputs (`Embedding(mask_zero=True)` upstream) when not given.
        training: whether the attention dropout is on.

    Returns:
        `(batch, features)` in the compute dtype. The output carries no mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 16, mask_zero=True)(tokens)
    >>> tuple(AttentionPooling(num_heads=2, key_dim=8)(x).shape)
    (None, 16)
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, **kwargs):
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_rate("dropout", dropout)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.supports_masking = True
        self.attention = MultiHeadAttention(
            num_heads, key_dim, dropout=dropout, dtype=self.dtype_policy, name="attention"
        )

    def build(self, input_shape):
        check_sequence_shape("inputs", input_shape)
        features = input_shape[-1]
        self.query = self.add_weight(shape=(1, 1, features), initializer="glorot_uniform", name="query")
        self.attention.build((None, 1, features), (None, None, features))

    def call(self, inputs, mask=None, training=None):
        batch = ops.shape(inputs)[0]
        query = ops.broadcast_to(
            ops.cast(self.query, inputs.dtype), (batch, 1, inputs.shape[-1])
        )  # (batch, 1, features)
        if mask is None:
            return self.attention(query, inputs, training=training)[:, 0]
        check_padding_mask("mask", mask, inputs.shape)
        mask = ops.cast(mask, "bool")  # (batch, seq)
        pooled = self.attention(query, inputs, attention_mask=ops.expand_dims(mask, 1), training=training)[:, 0]
        # A row with no real position reads nothing: zeros, not the output projection's bias.
        return ops.where(ops.any(mask, axis=1, keepdims=True), pooled, ops.zeros_like(pooled))  # (batch, features)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "key_dim": self.key_dim, "dropout": self.dropout})
        return config
