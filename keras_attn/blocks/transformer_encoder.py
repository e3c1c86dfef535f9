"""Transformer encoder block: self-attention and feed-forward, each with a residual and a norm."""

import re

import keras

from keras_attn import patterns
from keras_attn.blocks.feed_forward import FeedForward
from keras_attn.core import position_bias as position_biases
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import zero_padding
from keras_attn.core.segments import resolve_segment_ids
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.layers.capabilities import describe
from keras_attn.layers.capabilities import unsupported
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.segment_arguments import real_tokens
from keras_attn.utils import as_float_inputs
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import clone_initializer
from keras_attn.utils import keras_mask
from keras_attn.validation import check_bool
from keras_attn.validation import check_number
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_rate


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

    # Block options that only configure the default self-attention (a given one has its own).
    default_self_attention_options = ("sliding_window", "attention_pattern", "position_bias")

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
        attention_pattern=None,
        self_attention=None,
        position_bias=None,
        **kwargs,
    ):
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim, allow_none=True)
        check_rate("dropout", dropout)
        check_number("layer_norm_epsilon", layer_norm_epsilon, above=0)
        check_positive_int("sliding_window", sliding_window, allow_none=True)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        check_bool("norm_first", norm_first)
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
        self.attention_pattern = patterns.get(attention_pattern, "attention_pattern")
        self.position_bias = position_biases.check_position_bias(position_biases.get(position_bias), num_heads)
        self.self_attention_prototype = self._check_self_attention(self_attention)

    def _check_self_attention(self, layer):
        """The self-attention prototype (a layer, or the config `get_config` wrote), or `None`, checked."""
        if layer is None:
            return None
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, keras.layers.Layer) or not isinstance(
            getattr(type(layer), "capabilities", None), AttentionCapabilities
        ):
            raise TypeError(
                "`self_attention` must be a keras_attn attention layer, one whose class declares its `capabilities` "
                "(a prototype: each block builds its own copy from its config), or None. "
                f"Received: self_attention={layer!r}"
            )
        given = {name: getattr(self, name) for name in self.default_self_attention_options}
        given = {name: value for name, value in given.items() if value is not None}
        if given:
            raise ValueError(
                f"{', '.join(f'`{name}`' for name in given)} configure the default self-attention; set them on "
                f"the given `self_attention` layer instead. Received: {given}, self_attention={type(layer).__name__}"
            )
        heads = getattr(layer, "num_heads", self.num_heads)
        if heads != self.num_heads:
            raise ValueError(
                "`num_heads` must be the `self_attention` layer's number of heads. Received: "
                f"num_heads={self.num_heads}, {type(layer).__name__}.num_heads={heads}"
            )
        return layer

    def _self_attention(self, hidden_dim):
        """The self-attention sublayer: a copy of the prototype (own weights, the block's dtype) or the default."""
        if self.self_attention_prototype is None:
            return self._attention(
                "self_attention",
                hidden_dim,
                sliding_window=self.sliding_window,
                attention_pattern=self.attention_pattern,
                position_bias=self.position_bias,
            )
        config = self.self_attention_prototype.get_config()
        config.update(name="self_attention", dtype=self.dtype_policy)
        return type(self.self_attention_prototype).from_config(config)

    def _build_self_attention(self, sequence_shape):
        self.self_attention = self._self_attention(sequence_shape[-1])
        self.self_attention.build(sequence_shape)  # self-attention: `value_shape` is the query's
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm", sequence_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")

    def _attention(self, name, hidden_dim, sliding_window=None, attention_pattern=None, position_bias=None):
        """Builds an attention sublayer; a subclass overrides it to use another layer (take `**options`)."""
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_size(hidden_dim, self.num_heads, self.key_dim),
            dropout=self.dropout if self.attention_dropout is None else self.attention_dropout,
            sliding_window=sliding_window,
            attention_pattern=attention_pattern,
            num_key_value_heads=self.num_key_value_heads,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            position_bias=position_bias,
            dtype=self.dtype_policy,
            name=name,
        )

    def _checked_segment_ids(self, layer, name, segment_ids, length, batch=None):
        """`segment_ids` (`name` in the block's call) as int32 `(batch, length)`, `None` without; the
        `unsupported` error when `layer`'s family does not declare `segments` (it would attend across
        the documents), the `ValueError` naming `name` for ids that are not one int per token."""
        if segment_ids is None:
            return None
        if not type(layer).capabilities.segments:
            raise unsupported(layer, "segments", f"{name}.shape={describe(segment_ids)} in {type(self).__name__}")
        try:
            return resolve_segment_ids(segment_ids, None, None, length, length, batch)[0]
        except ValueError as error:  # the block's argument name, not the attention's
            raise ValueError(re.sub(r"\bsegment_ids\b", name, str(error))) from None

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
                "attention_pattern": keras.saving.serialize_keras_object(self.attention_pattern),
                "self_attention": (
                    None
                    if self.self_attention_prototype is None
                    else keras.saving.serialize_keras_object(self.self_attention_prototype)
                ),
                "position_bias": keras.saving.serialize_keras_object(self.position_bias),
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
    heads and sliding window), or the layer given as `self_attention`.

    Padding: a Keras mask on `inputs` (from `Embedding(mask_zero=True)` or
    `TokenAndPositionEmbedding` upstream) is used as `padding_mask` when none is passed; an
    explicit `padding_mask` always wins. Padded positions are never attended to, and padded
    queries get a zero attention output, so padded content never changes the outputs at real
    positions. Padded rows of `inputs` are zeroed (by selection) before the block reads them, so
    whatever they hold, NaN and inf included, reaches no real output and no weight gradient;
    the block's own outputs there are finite but not zero (the residual and the feed-forward
    run on every row). The output keeps the input's Keras mask.

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
        attention_pattern: optional `keras_attn.patterns.Pattern` (or its config) of the
            self-attention, intersected with `sliding_window` and the masks.
        self_attention: optional self-attention layer used as a prototype, as
            `keras.layers.Bidirectional` uses its `layer`: the block builds its own copy from
            the layer's config (its own weights, the block's dtype policy) and saves the config
            with its own. Any attention family (`keras_attn.attention_families`), called the one
            way every family is, `layer(x, query_mask=padding_mask, value_mask=padding_mask,
            attention_mask=..., return_attention_scores=..., training=...)`; a call option the
            family's `capabilities` exclude (e.g. `attention_mask` for `LinearAttention`) raises
            a `ValueError` from the family naming it. Its number of heads must be `num_heads`;
            `key_dim`, `attention_dropout`, `num_key_value_heads`, `sliding_window`,
            `attention_pattern` and `position_bias` are then the layer's own business (passing them raises). A seeded prototype gives every
            block the same random draws (initial weights, random features, rotations).
        position_bias: optional `keras_attn.core.position_bias.PositionBias` layer (or its config)
            for `num_heads` heads, e.g. `keras_attn.RelativePositionBias(num_heads)`, added to
            the self-attention logits (`MultiHeadAttention(position_bias=...)`).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, hidden)`.
        padding_mask: optional boolean `(batch, seq)`, `True` for real tokens.
        attention_mask: optional boolean `(batch, seq, seq)` or `(batch, heads, seq, seq)`,
            `True` where position `i` may attend to position `j`; combined with the padding.
            Only for a family whose `capabilities.attention_mask` is `True`.
        training: whether dropout is active.
        return_attention_scores: if `True`, also return the attention weights
            `(batch, heads, seq, key_len)` (`key_len` is `projected_length` for Linformer).
        segment_ids: optional int `(batch, seq)`: the documents of packed rows, `1, 2, ...` for
            the tokens of each document, `0` for padding (`keras_attn.core.segments`,
            T5X/seqio's `segment_ids`). Each token attends only to the tokens of its own
            document (intersected with the padding and attention masks), so every document's
            outputs and gradients are those of the document alone in its own row; a token of id
            `0` is padding, as if `padding_mask` were `False` there. Only for a family whose
            `capabilities.segments` is `True` (else a `ValueError` naming the family and why).
            Positions are the caller's: give the embedding positions restarting per document
            (`keras_attn.document_positions(segment_ids)`).

    Returns:
        `(batch, seq, hidden)`, and the attention weights when `return_attention_scores`.

    Example:

    >>> ids = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 64, mask_zero=True)(ids)
    >>> x = TransformerEncoder(intermediate_dim=128, num_heads=4)(x)  # padding from the mask
    >>> model = keras.Model(ids, x)
    >>> tuple(model(keras.ops.convert_to_tensor([[5, 8, 0]])).shape)
    (1, 3, 64)
    >>> from keras_attn import LinearAttention
    >>> linear = TransformerEncoder(128, 4, self_attention=LinearAttention(num_heads=4, key_dim=16))
    >>> tuple(linear(keras.random.normal((1, 300, 64))).shape)
    (1, 300, 64)
    """

    # The encoder has no other attention: every attention option configures the default one.
    default_self_attention_options = (
        "sliding_window",
        "attention_pattern",
        "position_bias",
        "num_key_value_heads",
        "attention_dropout",
        "key_dim",
    )

    def build(self, inputs_shape):
        check_sequence_shape("inputs", inputs_shape)
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: inputs_shape[-1]}, name="inputs")  # every call
        self._build_self_attention(inputs_shape)
        self._build_feed_forward(inputs_shape)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        segment_ids=None,
    ):
        padding_mask = keras_mask(inputs) if padding_mask is None else padding_mask
        check_padding_mask("padding_mask", padding_mask, inputs.shape)
        inputs = as_float_inputs(inputs, self.compute_dtype)  # ints and booleans, as Keras's layers take them
        segment_ids = self._checked_segment_ids(
            self.self_attention, "segment_ids", segment_ids, inputs.shape[1], inputs.shape[0]
        )
        # The residual and the feed-forward see every row: a padded one is zeroed first, so that what
        # it held (NaN, inf) reaches no weight gradient (the Keras mask stays the output's).
        inputs = zero_padding(inputs, merge_masks(padding_mask, real_tokens(segment_ids)))
        documents = {} if segment_ids is None else {"segment_ids": segment_ids}  # a family without them: no keyword

        def attend(x):
            attended = self.self_attention(
                x,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                **documents,
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
