"""`models.masked_language_model`: its logits against a NumPy forward pass of the head over the
encoder's states (gathered positions, tied output projection), its layers shared with the
classifier by name, and its loss falling when trained on tiny data."""

import math

import keras
import numpy as np
import tensorflow as tf

from models.masked_language_model import build_masked_language_model
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import load_encoder_weights
from models.token_masking import mask_tokens

CONFIG = SentimentClassifierConfig(
    vocabulary_size=40,
    max_tokens=32,
    sequence_length=16,
    embedding_dim=8,
    num_heads=2,
    intermediate_dim=16,
    bigram_buckets=64,
    dropout=0.0,
)


def test_logits_are_the_tied_head_at_the_masked_positions():
    keras.utils.set_random_seed(0)
    model, encoder = build_masked_language_model(CONFIG)
    ids = np.random.default_rng(0).integers(2, CONFIG.vocabulary_size, (3, 12)).astype("int32")
    ids[1, 7:] = 0
    positions = np.array([[0, 5, 11], [2, 6, 0], [4, 4, 9]], "int32")
    logits = model({"token_ids": ids, "masked_positions": positions}).numpy()  # (3, 3, vocabulary)

    states = encoder(ids).numpy()  # (3, 12, embedding_dim)
    gathered = states[np.arange(3)[:, None], positions]  # (3, 3, embedding_dim)
    kernel, bias = model.get_layer("mlm_transform").get_weights()
    pre = gathered @ kernel + bias
    hidden = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))  # exact GELU
    gamma, beta = model.get_layer("mlm_layer_norm").get_weights()
    normal = (hidden - hidden.mean(-1, keepdims=True)) / np.sqrt(hidden.var(-1, keepdims=True) + 1e-5) * gamma + beta
    embeddings = encoder.get_layer("token_and_position_embedding").token_embedding.get_weights()[0]
    output_bias = model.get_layer("mlm_logits").bias.numpy()
    np.testing.assert_allclose(logits, normal @ embeddings.T + output_bias, atol=1e-5)
    assert logits.dtype == np.float32


def test_encoder_layers_are_the_classifiers_by_name():
    _, encoder = build_masked_language_model(CONFIG)
    classifier = build_sentiment_classifier(CONFIG)
    copied = load_encoder_weights(classifier, encoder)
    assert copied == ["token_and_position_embedding", "encoder_0"]
    for name in copied:
        for got, want in zip(classifier.get_layer(name).get_weights(), encoder.get_layer(name).get_weights()):
            np.testing.assert_array_equal(got, want)
    # The tied projection adds one bias, not a second embedding table.
    model, _ = build_masked_language_model(CONFIG)
    assert len(model.trainable_variables) == len({id(variable) for variable in model.trainable_variables})


def test_loss_falls_on_tiny_data():
    keras.utils.set_random_seed(1)
    model, _ = build_masked_language_model(CONFIG)
    # Rows repeating a two-word pattern: a masked word is predictable from its neighbours.
    rng = np.random.default_rng(1)
    pairs = rng.integers(2, CONFIG.vocabulary_size, (64, 2))
    ids = np.tile(pairs, (1, 8)).astype("int32")  # (64, 16)
    batches = (
        tf.data.Dataset.from_tensor_slices(ids)
        .batch(16)
        .enumerate()
        .map(lambda index, batch: mask_tokens(batch, tf.stack([index, 0]), CONFIG.vocabulary_size, rate=0.3))
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
    )
    losses = model.fit(batches, epochs=15, verbose=0, shuffle=False).history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
