"""IMDB training on packed rows (`--pack`): `pipelines.batching.pack_documents` against a NumPy
reading of its rows; on a fixed batch of real reviews the packed masked language model and the
packed classifier, given the padded models' weights, have the padded models' losses (and
gradients); both commands run end to end with `--pack` in --smoke size."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.imdb_text import adapt_review_vectorizer
from models.masked_language_model import build_masked_language_model
from models.sentiment_classifier import BRANCHES
from models.sentiment_classifier import adapt_ngram_weights
from models.sentiment_classifier import build_review_encoder
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import load_encoder_weights
from models.sentiment_classifier import training_model
from models.token_masking import mask_tokens
from pipelines import imdb_data
from pipelines import pretrain_imdb
from pipelines import train_imdb
from pipelines.batching import pack_documents
from tests.imdb_fixtures import smoke_args

# Two blocks and hashed bigrams in the attention branch: every place a packed row could leak
# from one review into the next (attention, positions, bigrams) is exercised.
CONFIG = dataclasses.replace(train_imdb.SMOKE_MODEL, num_layers=2, attention_bigram_buckets=64, dropout=0.0)
REVIEWS = 12


def test_pack_documents_places_every_token_once_in_rows_that_never_overflow():
    rng = np.random.default_rng(3)
    lengths = np.array([7, 1, 10, 3, 3, 9, 2, 5, 10, 4])
    token_ids = np.zeros((len(lengths), 10), np.int32)
    for document, length in enumerate(lengths):
        token_ids[document, :length] = rng.integers(2, 50, size=length)
    packed = {name: value.numpy() for name, value in pack_documents(token_ids, 12).items()}
    rows, segments, index = packed["packed_ids"], packed["segment_ids"], packed["token_index"]
    assert rows.shape == segments.shape and rows.shape[1] == 12 and rows.shape[0] < len(lengths)
    for document, length in enumerate(lengths):
        places = index[document, :length]
        np.testing.assert_array_equal(rows.reshape(-1)[places], token_ids[document, :length])
        np.testing.assert_array_equal(segments.reshape(-1)[places], document + 1)
        assert len(set(places // 12)) == 1 and np.all(np.diff(places) == 1)  # whole, in one row, in order
        assert np.all(index[document, length:] == 0)
    assert (segments > 0).sum() == lengths.sum() and np.all((rows > 0) == (segments > 0))
    # First fit, longest first (by hand): 10 | 10 | 9 | 7+5 | 4 (no room left above), then 3 -> row 2,
    # 3 -> row 4, 2 -> row 0, 1 -> row 1.
    assert np.count_nonzero(rows, axis=1).tolist() == [12, 11, 12, 12, 7]


def test_pack_documents_refuses_a_document_longer_than_a_row():
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than `row_length`=3"):
        pack_documents(np.array([[5, 6, 7, 8]], np.int32), 3)


@pytest.fixture(scope="module")
def reviews(small_imdb_archive, imdb_cache_dir):
    """`(ids (REVIEWS, longest), labels)`: real training reviews, tokenised with a vectoriser
    adapted on them, cut to the smoke attention length."""
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir, allow_download=False)
    splits = imdb_data.split_reviews(cache, validation_size=10, max_train=REVIEWS)
    vectorizer = adapt_review_vectorizer(splits.train.map(lambda text, _: text), 2_000)
    ids = imdb_data.token_ids(splits.train, vectorizer, CONFIG.sequence_length)
    return next(iter(imdb_data.padded(ids, REVIEWS))), vectorizer.vocabulary_size()


def loss_and_gradients(model, inputs, loss):
    with tf.GradientTape() as tape:
        value = loss(model(inputs, training=False))
    return value.numpy(), [
        tf.convert_to_tensor(gradient).numpy() for gradient in tape.gradient(value, model.trainable_weights)
    ]


def assert_same_loss_and_gradients(padded, packed):
    (padded_loss, padded_gradients), (packed_loss, packed_gradients) = padded, packed
    np.testing.assert_allclose(packed_loss, padded_loss, rtol=1e-5)
    assert len(packed_gradients) == len(padded_gradients)
    for got, want in zip(packed_gradients, padded_gradients):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_packed_masked_language_model_has_the_padded_loss_and_gradients(reviews):
    (ids, _), vocabulary_size = reviews
    config = dataclasses.replace(CONFIG, vocabulary_size=vocabulary_size)
    inputs, labels, weights = mask_tokens(ids, tf.constant([4, 2], tf.int64), vocabulary_size)
    packed_inputs, packed_labels, packed_weights = pretrain_imdb.packed_masking(
        inputs, labels, weights, config.sequence_length
    )
    assert packed_inputs["packed_ids"].shape[0] < REVIEWS  # several reviews share a row
    padded_model, _ = build_masked_language_model(config)
    packed_model, _ = build_masked_language_model(config, packed=True)
    load_encoder_weights(packed_model, padded_model)  # every layer: the same weights
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    assert_same_loss_and_gradients(
        loss_and_gradients(padded_model, inputs, lambda logits: cross_entropy(labels, logits, weights)),
        loss_and_gradients(
            packed_model, packed_inputs, lambda logits: cross_entropy(packed_labels, logits, packed_weights)
        ),
    )


def test_packed_classifier_has_the_padded_outputs_loss_and_gradients(reviews):
    (ids, labels), vocabulary_size = reviews
    config = dataclasses.replace(CONFIG, vocabulary_size=vocabulary_size)
    padded_model = build_sentiment_classifier(config)
    adapt_ngram_weights(padded_model, tf.data.Dataset.from_tensors((ids, labels)))
    packed_model = build_sentiment_classifier(config, packed=True)
    load_encoder_weights(packed_model, padded_model)
    packed_inputs = {"token_ids": ids, **imdb_data.packed(ids, config.sequence_length)}
    assert packed_inputs["packed_ids"].shape[0] < REVIEWS
    binary = keras.losses.BinaryCrossentropy()

    def loss(outputs):  # what `train_imdb` minimises: the sum of the branch losses, per review
        return sum(binary(labels, outputs[branch]) for branch in BRANCHES)

    padded, packed = training_model(padded_model), training_model(packed_model)
    np.testing.assert_allclose(
        packed_model(packed_inputs, training=False), padded_model(ids, training=False), rtol=1e-5, atol=1e-6
    )
    assert_same_loss_and_gradients(
        loss_and_gradients(padded, ids, loss), loss_and_gradients(packed, packed_inputs, loss)
    )


def test_packed_encoder_refuses_ngram_attention():
    with pytest.raises(ValueError, match="attention_inputs='ngrams'"):
        build_review_encoder(dataclasses.replace(CONFIG, attention_inputs="ngrams"), packed=True)


def test_pack_is_refused_with_multi_worker_training():
    with pytest.raises(SystemExit):
        train_imdb.parse_args(["--smoke", "--pack", "--strategy", "multi_worker"])


@pytest.mark.slow
def test_pretraining_and_classifier_run_packed_end_to_end(small_imdb_archive, imdb_cache_dir, tmp_path):
    directory = tmp_path / "imdb_pretrain"
    pretraining = pretrain_imdb.main(
        smoke_args(small_imdb_archive, imdb_cache_dir, directory, "--pack", "--epochs", "1")
    )
    assert pretraining["epochs"][0]["loss"] > 0 and pretraining["epochs"][0]["val_loss"] > 0
    # The checkpoint is a padded encoder's: the padded classifier loads it, trained packed again.
    run = train_imdb.main(smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path / "run", "--pack", "--epochs", "1"))
    assert run.summary["pretrained"] == {"directory": str(directory), "epochs": 1}
    assert 0 <= run.summary["test_accuracy"] <= 1 and run.summary["epochs_run"] == 1
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["pack"] is True
