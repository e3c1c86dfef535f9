"""Transformer encoder block: self-attention and feed-forward, each with a residual and a norm."""

import keras

from keras_attn.feed_forward import FeedForward
from keras_attn.multi_head_attention import MultiHeadAttention
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_positive_int
from keras_attn.utils import check_rate
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import clone_initializer
from keras_attn.utils import keras_mask


def head_size(hidden_dim, num_heads, key_dim):
    """`key_dim`, or `hidden_dim // num_heads` when it is `None` (which must then divide)."""
    if key_dim is not None:
        return key_dim
    if hidden_dim % num_heads:
        raise ValueError(
            "Without `key_dim`, `num_heads` must divide the hidden size. Received: "
            f"hidden size={hidden_dim}, num_heads={num_heads}"
        )
    return hidden_dim // num_heads


class TransformerBlock(keras.layers.Layer):
    """Arguments, sublayers and residual wiring shared by `TransformerEncoder` and `TransformerDecoder`."""

    def __init__(
        self,
        intermediate_dim,
        num_heads,
        key_dim=None,
        dropout=0.0,
        attention_dropout=None,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        sliding_window=None,
        num_key_value_heads=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim, allow_none=True)
        check_rate("dropout", dropout)
        if attention_dropout is not None:
            check_rate("attention_dropout", attention_dropout)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = norm_first
        self.sliding_window = sliding_window
        self.num_key_value_heads = num_key_value_heads
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _attention(self, name, hidden_dim, sliding_window=None):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_size(hidden_dim, self.num_heads, self.key_dim),
            dropout=self.dropout if self.attention_dropout is None else self.attention_dropout,
            sliding_window=sliding_window,
            num_key_value_heads=self.num_key_value_heads,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _layer_norm(self, name, shape):
        norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)
        norm.build(shape)
        return norm

    def _dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _build_feed_forward(self, sequence_shape):
        self.feed_forward = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(sequence_shape)
        self.feed_forward_layer_norm = self._layer_norm("feed_forward_layer_norm", sequence_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")

    def _residual(self, inputs, sublayer, layer_norm, dropout, training):
        """`norm(x + drop(f(x)))` (post-norm) or `x + drop(f(norm(x)))` (`norm_first`).

        `sublayer` maps the (normalised) inputs to `(output, extra)`; returns `(x, extra)`.
        """
        normalized = layer_norm(inputs) if self.norm_first else inputs
        output, extra = sublayer(normalized)
        output = inputs + dropout(output, training=training)
        return (output if self.norm_first else layer_norm(output)), extra

    def _feed_forward_block(self, inputs, training):
        output, _ = self._residual(
            inputs,
            lambda x: (self.feed_forward(x, training=training), None),
            self.feed_forward_layer_norm,
            self.feed_forward_dropout,
            training,
        )
        return output

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "norm_first": self.norm_first,
                "sliding_window": self.sliding_window,
                "num_key_value_heads": self.num_key_value_heads,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoder(TransformerBlock):
    """Transformer encoder block (Vaswani et al., 2017): self-attention, then feed-forward.

    Each sub-block is wrapped in a residual connection and a layer normalisation, after the
    residual (post-norm, the paper and BERT) or, with `norm_first=True`, on the sub-block's
    input (pre-norm, GPT-2 and most recent models). Self-attention is
    `keras_attn.MultiHeadAttention` (exact masking, float32 softmax, optional grouped-query
    heads and sliding window).

    Padding: a Keras mask on `inputs` (from `Embedding(mask_zero=True)` or
    `TokenAndPositionEmbedding` upstream) is used as `padding_mask` when none is passed; an
    explicit `padding_mask` always wins. Padded positions are never attended to, and padded
    queries get a zero attention output, so padded content never changes the outputs at real
    positions. The output keeps the input's Keras mask.

    Args:
        intermediate_dim: width of the feed-forward hidden layer.
        num_heads: number of attention heads.
        key_dim: size of each attention head; defaults to `hidden // num_heads` (which must
            then divide).
        dropout: dropout on each sub-block's output before the residual add (and on the
            attention weights unless `attention_dropout` is given).
        attention_dropout: dropout on the attention weights; defaults to `dropout`.
        activation: feed-forward activation.
        layer_norm_epsilon: epsilon of the layer normalisations.
        norm_first: pre-norm (`True`) or post-norm (`False`).
        sliding_window: optional positive int; each position attends to `|i - j| < window`.
        num_key_value_heads: key/value heads for grouped-query attention (divides `num_heads`).
        kernel_initializer: initializer of every kernel.
        bias_initializer: initializer of every bias.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, hidden)`.
        padding_mask: optional boolean `(batch, seq)`, `True` for real tokens.
        attention_mask: optional boolean `(batch, seq, seq)` or `(batch, heads, seq, seq)`,
            `True` where position `i` may attend to position `j`; combined with the padding.
        training: whether dropout is active.
        return_attention_scores: if `True`, also return the attention weights
            `(batch, heads, seq, seq)`.

    Returns:
        `(batch, seq, hidden)`, and the attention weights when `return_attention_scores`.

    Example:

    >>> ids = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 64, mask_zero=True)(ids)
    >>> x = TransformerEncoder(intermediate_dim=128, num_heads=4)(x)  # padding from the mask
    >>> model = keras.Model(ids, x)
    >>> tuple(model(keras.ops.convert_to_tensor([[5, 8, 0]])).shape)
    (1, 3, 64)
    """

    def build(self, inputs_shape):
        check_sequence_shape("inputs", inputs_shape)
        self.self_attention = self._attention("self_attention", inputs_shape[-1], self.sliding_window)
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self._build_feed_forward(inputs_shape)

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None, return_attention_scores=False):
        padding_mask = keras_mask(inputs) if padding_mask is None else padding_mask
        check_padding_mask("padding_mask", padding_mask)

        def attend(x):
            attended = self.self_attention(
                x,
                x,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )  # (batch, seq, hidden)[, (batch, heads, seq, seq)]
            # Scores only when asked: asking would also keep long inputs off blockwise attention.
            return attended if return_attention_scores else (attended, None)

        x, scores = self._residual(
            inputs, attend, self.self_attention_layer_norm, self.self_attention_dropout, training
        )
        x = self._feed_forward_block(x, training)
        if return_attention_scores:
            return x, scores
        return x
