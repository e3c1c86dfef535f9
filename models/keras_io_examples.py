"""Four keras.io examples as their authors publish them: `keras.layers.MultiHeadAttention` in custom layers and in functional models.

- `text_classifier`: "Text classification with Transformer" (keras.io/examples/nlp/
  text_classification_with_transformer): `TokenAndPositionEmbedding`, one `TransformerBlock`
  (self-attention with `key_dim=embed_dim`, post-norm, a ReLU feed-forward), mean pooling and a
  softmax head. Published sizes: embedding 32, 2 heads, feed-forward 32, vocabulary 20,000.
- `english_to_spanish_translator`: "English-to-Spanish translation with a sequence-to-sequence
  Transformer" (keras.io/examples/nlp/neural_machine_translation_with_transformer):
  an encoder model (`PositionalEmbedding`, token id 0 is padding, and a `TransformerEncoder` with
  the padding mask) and a decoder model (a `TransformerDecoder` with an explicit causal mask,
  built as the example builds it, and cross-attention under the decoder's padding mask intersected
  with it, as published), dropout 0.5 and a softmax over the target vocabulary.
  Published sizes: embedding 256, 8 heads, feed-forward 2,048, vocabulary 15,000.
- `timeseries_transformer`: "Timeseries classification with a Transformer model" (keras.io/examples/
  timeseries/timeseries_classification_transformer): functional pre-norm-free encoder blocks
  (attention with dropout, a 1x1-convolution feed-forward), mean pooling, an MLP head. Published
  sizes: 500 steps of 1 feature, 4 blocks of 4 heads of 256, feed-forward 4, dropout 0.25 (attention
  dropout included), MLP 128 with dropout 0.4.
- `vision_transformer`: "Image classification with Vision Transformer" (keras.io/examples/vision/
  image_classification_with_vision_transformer): `Patches` (`keras.ops.image.extract_patches`) and
  `PatchEncoder`, 8 pre-norm blocks of 4 heads of 64 with attention dropout 0.1, a GELU MLP
  `[128, 64]`, a flattened head. Published sizes: 72 x 72 images in 6 x 6 patches (144 tokens),
  head `[2048, 1024]`, 100 classes; the example's data augmentation (resizing its 32 x 32 CIFAR
  images to 72) is left out: the model takes images of `image_size`.

They are what `keras_attn.convert` meets in users' code (attention inside custom layers), for its
tests and for `benchmarks/convert_models.py`. The layers are registered and have configs, so the
models save and load as `.keras`.
"""

import keras
from keras import layers
from keras import ops

_PACKAGE = "keras_io_examples"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, embed_dim
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
        return self.token_emb(x) + positions

    def get_config(self):
        return {
            **super().get_config(),
            "maxlen": self.maxlen,
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
        }


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.ff_dim, self.rate = embed_dim, num_heads, ff_dim, rate
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "ff_dim": self.ff_dim,
            "rate": self.rate,
        }


def text_classifier(maxlen=200, vocab_size=20000, embed_dim=32, num_heads=2, ff_dim=32):
    """The keras.io Transformer text classifier: token ids `(batch, maxlen)` -> 2 class probabilities."""
    inputs = layers.Input(shape=(maxlen,))
    x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
    x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PositionalEmbedding(layers.Layer):
    def __init__(self, sequence_length, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length, self.vocab_size, self.embed_dim = sequence_length, vocab_size, embed_dim
        self.token_embeddings = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.position_embeddings = layers.Embedding(input_dim=sequence_length, output_dim=embed_dim)

    def call(self, inputs):
        positions = ops.arange(0, ops.shape(inputs)[-1], 1)
        return self.token_embeddings(inputs) + self.position_embeddings(positions)

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
        }


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerEncoder(layers.Layer):
    def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.dense_dim, self.num_heads = embed_dim, dense_dim, num_heads
        self.attention = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.dense_proj = keras.Sequential([layers.Dense(dense_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.supports_masking = True

    def call(self, inputs, mask=None):
        padding_mask = None if mask is None else ops.cast(mask[:, None, :], dtype="int32")
        attention_output = self.attention(query=inputs, value=inputs, key=inputs, attention_mask=padding_mask)
        proj_input = self.layernorm_1(inputs + attention_output)
        return self.layernorm_2(proj_input + self.dense_proj(proj_input))

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "dense_dim": self.dense_dim,
            "num_heads": self.num_heads,
        }


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerDecoder(layers.Layer):
    def __init__(self, embed_dim, latent_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.latent_dim, self.num_heads = embed_dim, latent_dim, num_heads
        self.attention_1 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.attention_2 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.dense_proj = keras.Sequential([layers.Dense(latent_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.layernorm_3 = layers.LayerNormalization()
        self.supports_masking = True

    def call(self, inputs, encoder_outputs, mask=None):
        causal_mask = self.get_causal_attention_mask(inputs)
        if mask is not None:
            padding_mask = ops.cast(mask[:, None, :], dtype="int32")
            padding_mask = ops.minimum(padding_mask, causal_mask)
        else:
            padding_mask = None
        attention_output_1 = self.attention_1(query=inputs, value=inputs, key=inputs, attention_mask=causal_mask)
        out_1 = self.layernorm_1(inputs + attention_output_1)
        attention_output_2 = self.attention_2(
            query=out_1, value=encoder_outputs, key=encoder_outputs, attention_mask=padding_mask
        )
        out_2 = self.layernorm_2(out_1 + attention_output_2)
        return self.layernorm_3(out_2 + self.dense_proj(out_2))

    def get_causal_attention_mask(self, inputs):
        # The example tiles this to the batch size; one copy broadcasts the same (a tile by a
        # tensor of the symbolic batch size cannot be traced by Keras 3.15's shape inference).
        sequence_length = ops.shape(inputs)[1]
        i = ops.arange(sequence_length)[:, None]
        j = ops.arange(sequence_length)
        return ops.cast(i >= j, dtype="int32")[None, :, :]

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "latent_dim": self.latent_dim,
            "num_heads": self.num_heads,
        }


def english_to_spanish_translator(sequence_length=20, vocab_size=15000, embed_dim=256, latent_dim=2048, num_heads=8):
    """The keras.io English-to-Spanish Transformer: `[encoder_inputs, decoder_inputs]` token ids of the
    same length (0 is padding) -> next-token probabilities `(batch, length, vocab_size)`."""
    encoder_inputs = keras.Input(shape=(None,), dtype="int64", name="encoder_inputs")
    x = PositionalEmbedding(sequence_length, vocab_size, embed_dim)(encoder_inputs)
    encoder_outputs = TransformerEncoder(embed_dim, latent_dim, num_heads)(x)
    encoder = keras.Model(encoder_inputs, encoder_outputs, name="encoder")

    decoder_inputs = keras.Input(shape=(None,), dtype="int64", name="decoder_inputs")
    encoded_seq_inputs = keras.Input(shape=(None, embed_dim), name="decoder_state_inputs")
    x = PositionalEmbedding(sequence_length, vocab_size, embed_dim)(decoder_inputs)
    x = TransformerDecoder(embed_dim, latent_dim, num_heads)(x, encoded_seq_inputs)
    x = layers.Dropout(0.5)(x)
    decoder_outputs = layers.Dense(vocab_size, activation="softmax")(x)
    decoder = keras.Model([decoder_inputs, encoded_seq_inputs], decoder_outputs, name="decoder")

    decoder_outputs = decoder([decoder_inputs, encoder(encoder_inputs)])
    return keras.Model([encoder_inputs, decoder_inputs], decoder_outputs, name="transformer")


def _timeseries_encoder(inputs, head_size, num_heads, ff_dim, dropout):
    x = layers.MultiHeadAttention(key_dim=head_size, num_heads=num_heads, dropout=dropout)(inputs, inputs)
    x = layers.Dropout(dropout)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    res = x + inputs
    x = layers.Conv1D(filters=ff_dim, kernel_size=1, activation="relu")(res)
    x = layers.Dropout(dropout)(x)
    x = layers.Conv1D(filters=inputs.shape[-1], kernel_size=1)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return x + res


def timeseries_transformer(
    input_shape=(500, 1),
    head_size=256,
    num_heads=4,
    ff_dim=4,
    num_transformer_blocks=4,
    mlp_units=(128,),
    dropout=0.25,
    mlp_dropout=0.4,
    n_classes=2,
):
    """The keras.io timeseries Transformer: `(batch, steps, features)` -> `n_classes` probabilities."""
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for _ in range(num_transformer_blocks):
        x = _timeseries_encoder(x, head_size, num_heads, ff_dim, dropout)
    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    for dim in mlp_units:
        x = layers.Dense(dim, activation="relu")(x)
        x = layers.Dropout(mlp_dropout)(x)
    outputs = layers.Dense(n_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Patches(layers.Layer):
    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, images):
        batch_size, height, width, channels = ops.shape(images)
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        count = (height // self.patch_size) * (width // self.patch_size)
        return ops.reshape(patches, (batch_size, count, self.patch_size * self.patch_size * channels))

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches, self.projection_dim = num_patches, projection_dim
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(input_dim=num_patches, output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        return self.projection(patch) + self.position_embedding(positions)

    def get_config(self):
        return {**super().get_config(), "num_patches": self.num_patches, "projection_dim": self.projection_dim}


def _vit_mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def vision_transformer(
    image_size=72,
    patch_size=6,
    projection_dim=64,
    num_heads=4,
    transformer_layers=8,
    mlp_head_units=(2048, 1024),
    num_classes=100,
):
    """The keras.io ViT classifier: images `(batch, image_size, image_size, 3)` -> `num_classes` logits,
    `(image_size // patch_size) ** 2` tokens."""
    num_patches = (image_size // patch_size) ** 2
    inputs = keras.Input(shape=(image_size, image_size, 3))
    encoded_patches = PatchEncoder(num_patches, projection_dim)(Patches(patch_size)(inputs))
    for _ in range(transformer_layers):
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
        attention_output = layers.MultiHeadAttention(num_heads=num_heads, key_dim=projection_dim, dropout=0.1)(x1, x1)
        x2 = layers.Add()([attention_output, encoded_patches])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        x3 = _vit_mlp(x3, hidden_units=[projection_dim * 2, projection_dim], dropout_rate=0.1)
        encoded_patches = layers.Add()([x3, x2])
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
    representation = layers.Dropout(0.5)(layers.Flatten()(representation))
    features = _vit_mlp(representation, hidden_units=mlp_head_units, dropout_rate=0.5)
    return keras.Model(inputs=inputs, outputs=layers.Dense(num_classes)(features))
