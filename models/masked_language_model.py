"""The masked language model that pretrains the IMDB classifier's attention branch.

    token_ids (corrupted, `models.token_masking`) -> review_encoder -> hidden states at the
    masked positions -> dense + GELU -> layer norm -> logits over the vocabulary

The encoder is `models.sentiment_classifier.review_encoder`, the classifier's own, so its layers
carry the classifier's names and `load_encoder_weights` moves them over. The head is BERT's;
its output projection is the transposed token embedding plus a bias per token (tied): the
whole gradient of the loss reaches the embedding table that the classifier keeps, and no
vocabulary-sized matrix (1.3 M weights at the defaults) is trained to be thrown away. Logits
are computed at the masked positions only: over every position the 20,000-way projection would
cost several times the encoder.
"""

import keras
from keras import ops

from models.packed_documents import GatherTokens
from models.sentiment_classifier import build_review_encoder


class GatherPositions(keras.layers.Layer):
    """`hidden (batch, seq, dim)`, `positions (batch, targets)` int -> `(batch, targets, dim)`:
    the rows of `hidden` at `positions`. Its output carries no mask."""

    def call(self, hidden, positions):
        return ops.take_along_axis(hidden, ops.expand_dims(ops.cast(positions, "int32"), -1), axis=1)

    def compute_mask(self, hidden, positions, mask=None):
        return None

    def compute_output_shape(self, hidden_shape, positions_shape):
        return (*positions_shape, hidden_shape[-1])


class TiedTokenLogits(keras.layers.Layer):
    """`hidden (..., dim)` -> float32 logits `(..., vocabulary_size)`: `hidden @ embeddings.T + bias`,
    with the `embeddings` of `token_embedding` (a built `keras.layers.Embedding`) and a bias of its own."""

    def __init__(self, token_embedding, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding  # shared: its variable is tracked once (Keras dedups by id)

    def build(self, hidden_shape):
        self.bias = self.add_weight(name="bias", shape=(self.token_embedding.input_dim,), initializer="zeros")

    def call(self, hidden):
        embeddings = ops.cast(self.token_embedding.embeddings, hidden.dtype)  # (vocabulary_size, dim)
        logits = ops.matmul(hidden, ops.transpose(embeddings))  # (..., vocabulary_size)
        return ops.cast(logits, "float32") + ops.cast(self.bias, "float32")

    def compute_output_shape(self, hidden_shape):
        return (*hidden_shape[:-1], self.token_embedding.input_dim)

    def get_config(self):
        """The base config only: the shared embedding is no config value. The model is rebuilt by
        `build_masked_language_model` and its weights loaded, never deserialised."""
        return super().get_config()


def build_masked_language_model(config, packed=False):
    """The masked language model of `config`'s attention branch, as a functional `keras.Model`.

    Args:
        config: a `models.sentiment_classifier.SentimentClassifierConfig` (its `ENCODER_FIELDS`
            and `dropout`).
        packed: whether it reads packed rows (`pipelines.batching.pack_documents` of the corrupted
            ids): the inputs are then `packed_ids` and `segment_ids` (int32 `(rows, row_length)`)
            and `masked_positions` in the flattened rows (the padded batch's positions mapped
            through `token_index`), so the logits, labels and loss keep the padded batch's layout.

    Returns:
        `(model, encoder)`: `model`, named "masked_language_model", takes `{"token_ids": int32
        (batch, seq), "masked_positions": int32 (batch, targets)}` (`models.token_masking.mask_tokens`)
        and returns float32 logits `(batch, targets, vocabulary_size)`; `encoder`, named
        "review_encoder", is its encoder (`build_review_encoder`: the same layers), what a
        checkpoint keeps.
    """
    encoder = build_review_encoder(config, packed=packed)
    masked_positions = keras.Input((None,), dtype="int32", name="masked_positions")
    gather = GatherTokens if packed else GatherPositions
    hidden = gather(name="gather_masked")(encoder.output, masked_positions)  # (batch, targets, dim)
    hidden = keras.layers.Dense(config.embedding_dim, activation="gelu", name="mlm_transform")(hidden)
    hidden = keras.layers.LayerNormalization(epsilon=1e-5, name="mlm_layer_norm")(hidden)
    token_embedding = encoder.get_layer("token_and_position_embedding").token_embedding
    logits = TiedTokenLogits(token_embedding, name="mlm_logits")(hidden)  # (batch, targets, vocabulary_size)
    inputs = encoder.input if packed else {"token_ids": encoder.input}
    model = keras.Model({**inputs, "masked_positions": masked_positions}, logits, name="masked_language_model")
    return model, encoder
