"""Encoder-decoder Transformer translator (Vaswani et al., 2017) built from keras_attn layers.

`Translator` maps `(source_ids, target_in_ids)` to next-token logits `(batch, target_len,
target_vocabulary_size)` for teacher-forced training. Its pieces (`encode`, `embed_target`,
`decoder_layers`, `project`) are what `models.decoding` drives for greedy and beam search
with a key/value cache.
"""

import dataclasses

import keras
from keras import ops

from appkit.cli import config_field
from keras_attn.blocks.transformer_decoder import TransformerDecoder
from keras_attn.blocks.transformer_encoder import TransformerEncoder
from keras_attn.core.segments import document_positions
from keras_attn.positions.token_and_position_embedding import TokenAndPositionEmbedding
from models.serialization import register_serializable
from models.translation_text import END_TOKEN
from models.translation_text import START_TOKEN
from models.translator_self_attention import block_options
from models.translator_self_attention import check_choice
from models.vocabulary import PADDING_ID
from models.vocabulary import smallest_vocabulary_size


@dataclasses.dataclass(frozen=True)
class TranslatorConfig:
    """The default translator: small enough to train on a CPU (its model card, docs/models/translator.md, gives the training time)."""

    source_vocabulary_size: int = config_field(15_000, minimum=smallest_vocabulary_size())
    target_vocabulary_size: int = config_field(8_000, minimum=smallest_vocabulary_size((START_TOKEN, END_TOKEN)))
    sequence_length: int = 32
    embedding_dim: int = 192
    intermediate_dim: int = 768
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    dropout: float = 0.1
    tie_embeddings: bool = True
    attention: str = "dense"
    attention_window: int = 8

    def __post_init__(self):
        check_choice(self.attention, self.attention_window)

    def to_dict(self):
        return dataclasses.asdict(self)


def build_translator(config):
    """A built `Translator` from a `TranslatorConfig`."""
    model = Translator(**config.to_dict())
    model.build()
    return model


@register_serializable("keras_attn")
class Translator(keras.Model):
    """Transformer encoder-decoder for sequence-to-sequence translation.

    Encoder: token-and-position embedding + `num_encoder_layers` `TransformerEncoder` blocks.
    Decoder: token-and-position embedding + `num_decoder_layers` `TransformerDecoder` blocks
    (causal self-attention, cross-attention to the encoder output under the source padding
    mask, feed-forward); both stacks' self-attention is the `attention` choice
    (`models.translator_self_attention`), cross-attention always softmax attention. Then a projection to the target vocabulary, tied to the target
    token embedding when `tie_embeddings`. The blocks normalise first (pre-LN), so each stack
    ends with a layer normalisation.

    Args:
        source_vocabulary_size: number of source token ids (id 0 is padding).
        target_vocabulary_size: number of target token ids (id 0 is padding).
        sequence_length: the longest source and target sequence (positions embedded).
        embedding_dim: model width.
        intermediate_dim: feed-forward width.
        num_heads: attention heads (`embedding_dim` must be a multiple).
        num_encoder_layers: encoder blocks.
        num_decoder_layers: decoder blocks.
        dropout: dropout rate in every block and after the embeddings.
        tie_embeddings: project the decoder output with the transposed target embedding matrix
            (plus a bias) instead of a separate `Dense`.
        attention: the encoder and decoder self-attention, one of
            `models.translator_self_attention.CHOICES` ("dense", "window", "linear").
        attention_window: the window of `attention="window"` (`|i - j| < attention_window`).
        **kwargs: base `Model` arguments (`name`, `dtype`).

    Call arguments:
        inputs: a tuple `(source_ids, target_in_ids)` of int tensors `(batch, source_len)`,
            `(batch, target_len)`, zero-padded; or packed rows `(source_ids, target_in_ids,
            source_segment_ids, target_segment_ids)` holding several sentence pairs per row, pair
            `i` of a row numbered `i` in both segment ids (0 for padding): the encoder and the
            decoder self-attention stay inside each sentence, a target sentence's cross-attention
            reads only its own source, and positions restart at each sentence, so every pair is
            translated exactly as alone (`pipelines.translation_data.make_packed_dataset`).
        training: whether dropout is active.

    Returns:
        Float logits `(batch, target_len, target_vocabulary_size)`.

    Example:

    >>> model = Translator(100, 120, sequence_length=16, embedding_dim=32, intermediate_dim=64,
    ...                    num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
    >>> logits = model((keras.ops.ones((2, 7), "int32"), keras.ops.ones((2, 5), "int32")))
    >>> tuple(logits.shape)
    (2, 5, 120)
    """

    def __init__(
        self,
        source_vocabulary_size,
        target_vocabulary_size,
        sequence_length=32,
        embedding_dim=256,
        intermediate_dim=1024,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.1,
        tie_embeddings=True,
        attention="dense",
        attention_window=8,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if embedding_dim % num_heads:
            raise ValueError(
                "`embedding_dim` must be a multiple of `num_heads`. "
                f"Received: embedding_dim={embedding_dim}, num_heads={num_heads}"
            )
        self.source_vocabulary_size = source_vocabulary_size
        self.target_vocabulary_size = target_vocabulary_size
        self.sequence_length = sequence_length
        self.embedding_dim = embedding_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.dropout = dropout
        self.tie_embeddings = tie_embeddings
        self.attention = attention
        self.attention_window = attention_window

        def self_attention(causal):
            return block_options(attention, attention_window, num_heads, embedding_dim // num_heads, causal)

        self.source_embedding = TokenAndPositionEmbedding(
            source_vocabulary_size, sequence_length, embedding_dim, name="source_embedding"
        )
        self.target_embedding = TokenAndPositionEmbedding(
            target_vocabulary_size, sequence_length, embedding_dim, name="target_embedding"
        )
        self.source_dropout = keras.layers.Dropout(dropout, name="source_dropout")
        self.target_dropout = keras.layers.Dropout(dropout, name="target_dropout")
        self.encoder_layers = [
            TransformerEncoder(
                intermediate_dim,
                num_heads,
                dropout=dropout,
                norm_first=True,
                name=f"encoder_{index}",
                **self_attention(causal=False),
            )
            for index in range(num_encoder_layers)
        ]
        self.decoder_layers = [
            TransformerDecoder(
                intermediate_dim,
                num_heads,
                dropout=dropout,
                norm_first=True,
                name=f"decoder_{index}",
                **self_attention(causal=True),
            )
            for index in range(num_decoder_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="encoder_norm")
        self.decoder_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="decoder_norm")
        if tie_embeddings:
            self.output_bias = self.add_weight(name="output_bias", shape=(target_vocabulary_size,), initializer="zeros")
        else:
            self.output_projection = keras.layers.Dense(target_vocabulary_size, name="output_projection")

    def build(self, input_shape=None):
        source_shape = (None, self.sequence_length)
        hidden_shape = (None, self.sequence_length, self.embedding_dim)
        self.source_embedding.build(source_shape)
        self.target_embedding.build(source_shape)
        for layer in self.encoder_layers:
            layer.build(hidden_shape)
        for layer in self.decoder_layers:
            layer.build(hidden_shape, hidden_shape)
        self.encoder_norm.build(hidden_shape)
        self.decoder_norm.build(hidden_shape)
        if not self.tie_embeddings:
            self.output_projection.build(hidden_shape)
        self.built = True

    def source_padding_mask(self, source_ids):
        return ops.not_equal(source_ids, PADDING_ID)  # (batch, source_len)

    def encode(self, source_ids, training=None, source_segment_ids=None):
        """Encoder output `(batch, source_len, embedding_dim)`; of packed rows with `source_segment_ids`."""
        padding_mask = self.source_padding_mask(source_ids)
        embedded = self.source_embedding(source_ids, positions=sentence_positions(source_segment_ids))
        hidden = self.source_dropout(embedded, training=training)
        for layer in self.encoder_layers:
            hidden = layer(hidden, padding_mask=padding_mask, segment_ids=source_segment_ids, training=training)
        return self.encoder_norm(hidden)  # (batch, source_len, embedding_dim)

    def embed_target(self, target_ids, start_index=0, training=None, target_segment_ids=None):
        """Target embeddings of the tokens at positions `start_index ..` (or at their positions in
        their sentences, with `target_segment_ids`)."""
        positions = sentence_positions(target_segment_ids)
        embedded = self.target_embedding(target_ids, start_index=start_index, positions=positions)
        return self.target_dropout(embedded, training=training)  # (batch, target_len, embedding_dim)

    def project(self, hidden):
        """Final normalisation and projection to target logits `(..., target_vocabulary_size)`."""
        hidden = self.decoder_norm(hidden)
        if not self.tie_embeddings:
            return self.output_projection(hidden)
        embeddings = ops.cast(self.target_embedding.token_embedding.embeddings, hidden.dtype)
        logits = ops.matmul(hidden, ops.transpose(embeddings))  # (..., target_vocabulary_size)
        return logits + ops.cast(self.output_bias, hidden.dtype)

    def decode(
        self,
        target_ids,
        encoder_output,
        source_padding_mask,
        training=None,
        target_segment_ids=None,
        source_segment_ids=None,
    ):
        """Logits for every position of `target_ids`, without a cache (the full causal pass); of
        packed rows with `target_segment_ids` and `source_segment_ids`."""
        hidden = self.embed_target(target_ids, training=training, target_segment_ids=target_segment_ids)
        target_padding_mask = ops.not_equal(target_ids, PADDING_ID)  # (batch, target_len)
        for layer in self.decoder_layers:
            hidden = layer(
                hidden,
                encoder_output,
                decoder_padding_mask=target_padding_mask,
                encoder_padding_mask=source_padding_mask,
                decoder_segment_ids=target_segment_ids,  # causal self-attention within each target sentence
                encoder_segment_ids=source_segment_ids,  # cross-attention to the pair's own source
                training=training,
            )
        return self.project(hidden)  # (batch, target_len, target_vocabulary_size)

    def call(self, inputs, training=None):
        source_ids, target_ids, source_segment_ids, target_segment_ids = packed_inputs(inputs)
        encoder_output = self.encode(source_ids, training=training, source_segment_ids=source_segment_ids)
        return self.decode(
            target_ids,
            encoder_output,
            self.source_padding_mask(source_ids),
            training=training,
            target_segment_ids=target_segment_ids,
            source_segment_ids=source_segment_ids,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "source_vocabulary_size": self.source_vocabulary_size,
                "target_vocabulary_size": self.target_vocabulary_size,
                "sequence_length": self.sequence_length,
                "embedding_dim": self.embedding_dim,
                "intermediate_dim": self.intermediate_dim,
                "num_heads": self.num_heads,
                "num_encoder_layers": self.num_encoder_layers,
                "num_decoder_layers": self.num_decoder_layers,
                "dropout": self.dropout,
                "tie_embeddings": self.tie_embeddings,
                "attention": self.attention,
                "attention_window": self.attention_window,
            }
        )
        return config


def packed_inputs(inputs):
    """`(source_ids, target_ids, source_segment_ids, target_segment_ids)` of the call's `inputs`
    (the segment ids `None` for unpacked pairs)."""
    if len(inputs) not in (2, 4):
        raise ValueError(
            "`inputs` must be `(source_ids, target_in_ids)` or packed rows `(source_ids, target_in_ids, "
            f"source_segment_ids, target_segment_ids)`. Received: {len(inputs)} inputs"
        )
    if len(inputs) == 2:
        return (*inputs, None, None)
    return tuple(inputs)


def sentence_positions(segment_ids):
    """Each token's position in its sentence `(batch, length)`, or `None` unpacked.

    Given as `positions=`, not `segment_ids=`: the embeddings then check the positions against
    their table (`sequence_length`), where `segment_ids=` checks the row length, and a packed row
    is longer than the longest sentence it holds.
    """
    return None if segment_ids is None else document_positions(segment_ids)


@register_serializable("keras_attn")
class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens whose arg-max prediction is right (over all batches).

    Args:
        padding_id: the target id that is ignored.
        **kwargs: base `Metric` arguments (`name`, `dtype`).
    """

    def __init__(self, padding_id=PADDING_ID, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.padding_id = padding_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")  # (batch, target_len)
        counted = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")  # (batch, target_len)
        hits = ops.cast(ops.equal(predicted, y_true), "float32") * counted
        if sample_weight is not None:
            weight = ops.cast(sample_weight, "float32")
            hits, counted = hits * weight, counted * weight
        self.correct.assign_add(ops.sum(hits))
        self.total.assign_add(ops.sum(counted))

    def result(self):
        return ops.divide_no_nan(self.correct, self.total)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "padding_id": self.padding_id}


@register_serializable("keras_attn")
class SmoothedTranslationLoss(keras.losses.Loss):
    """Label-smoothed cross-entropy over the real target tokens (padding ignored).

    Each token's loss is `(1 - label_smoothing) * -log p(y) + label_smoothing * mean_v(-log p(v))`
    (the target distribution puts `label_smoothing` uniformly over the vocabulary; Szegedy et al.
    2016, used by Vaswani et al. 2017), averaged over the non-padding tokens of the batch; 0 is the
    plain cross-entropy.

    Args:
        label_smoothing: in [0, 1).
        padding_id: the target id that is ignored.
    """

    def __init__(self, label_smoothing=0.0, padding_id=PADDING_ID, name="translation_loss", **kwargs):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1). Received: label_smoothing={label_smoothing!r}")
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing
        self.padding_id = padding_id

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")  # (batch, target_len)
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)  # (batch, target_len, vocabulary)
        real = ops.not_equal(y_true, self.padding_id)
        target = ops.take_along_axis(log_probs, ops.expand_dims(ops.where(real, y_true, 0), -1), axis=-1)[..., 0]
        losses = -(1.0 - self.label_smoothing) * target - self.label_smoothing * ops.mean(log_probs, axis=-1)
        losses = ops.where(real, losses, 0.0)  # (batch, target_len)
        if self.reduction != "sum_over_batch_size":
            return losses
        # That reduction divides by every position: rescale so that it averages over the real tokens.
        real_tokens = ops.maximum(ops.sum(ops.cast(real, "float32")), 1.0)
        return losses * (ops.cast(ops.size(real), "float32") / real_tokens)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing, "padding_id": self.padding_id}


def translation_loss(label_smoothing=0.0):
    """The training loss: `SmoothedTranslationLoss` (mean over real tokens)."""
    return SmoothedTranslationLoss(label_smoothing)
