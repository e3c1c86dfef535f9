import dataclasses

import keras
import numpy as np
import pytest

from models.hashed_bigram_embedding import HashedBigramEmbedding
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import BRANCHES
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import training_model
from tests import layer_checks

TINY = SentimentClassifierConfig(
    vocabulary_size=50,
    sequence_length=12,
    embedding_dim=8,
    num_layers=2,
    num_heads=2,
    intermediate_dim=16,
    dropout=0.1,
    bigram_buckets=97,
    bigram_dim=4,
)


def token_ids(rng, lengths, width=10, vocabulary_size=50):
    ids = rng.integers(1, vocabulary_size, size=(len(lengths), width)).astype("int32")
    ids[np.arange(width)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return ids


def numpy_bigrams(ids, multiplier, buckets):
    """Oracle: hashed ids and mask of neighbouring pairs, in int64 (no overflow possible)."""
    first, second = ids[:, :-1].astype(np.int64), ids[:, 1:].astype(np.int64)
    return (first * multiplier + second) % buckets, (first != 0) & (second != 0)


def test_output_is_a_probability_per_review():
    ids = token_ids(np.random.default_rng(0), [10, 4, 1, 0])
    probability = keras.ops.convert_to_numpy(build_sentiment_classifier(TINY)(ids))
    assert probability.shape == (4, 1) and probability.dtype == np.float32
    assert np.all((probability > 0) & (probability < 1))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def test_prediction_averages_the_branch_logits_and_training_sees_each_branch():
    model = build_sentiment_classifier(TINY)
    ids = token_ids(np.random.default_rng(6), [10, 5, 1, 0])
    logits = keras.Model(model.input, [model.get_layer(f"{b}_logit").output for b in BRANCHES])(ids)
    attention_logit, bag_logit = (keras.ops.convert_to_numpy(t) for t in logits)
    outputs = {k: keras.ops.convert_to_numpy(v) for k, v in training_model(model)(ids).items()}
    assert sorted(outputs) == sorted([*BRANCHES, "probability"])
    np.testing.assert_allclose(outputs["attention"], sigmoid(attention_logit), atol=1e-6)
    np.testing.assert_allclose(outputs["bag"], sigmoid(bag_logit), atol=1e-6)
    expected = sigmoid((attention_logit + bag_logit) / 2)
    np.testing.assert_allclose(outputs["probability"], expected, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(ids)), expected, atol=1e-6)
    assert len(training_model(model).weights) == len(model.weights)


def test_padding_does_not_change_the_prediction():
    model = build_sentiment_classifier(TINY)
    ids = token_ids(np.random.default_rng(1), [10, 6, 2, 0])
    padded = np.pad(ids, [(0, 0), (0, 2)])  # up to sequence_length
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(padded)), keras.ops.convert_to_numpy(model(ids)), atol=1e-6
    )
    alone = [keras.ops.convert_to_numpy(model(ids[i : i + 1, : max(n, 1)])) for i, n in enumerate([10, 6, 2, 0])]
    np.testing.assert_allclose(np.concatenate(alone), keras.ops.convert_to_numpy(model(ids)), atol=1e-6)


@pytest.mark.parametrize(
    "changes",
    [{}, {"pooling": ("max",), "bigram_buckets": 0, "position_encoding": "sinusoidal"}],
)
def test_configurations_serialize_and_compile(changes):
    config = dataclasses.replace(TINY, **changes)
    ids = token_ids(np.random.default_rng(2), [10, 3, 0])
    layer_checks.assert_serialization_round_trip(lambda: build_sentiment_classifier(config), ids)
    layer_checks.assert_jit_matches_eager(build_sentiment_classifier(config), ids, training=False)
    assert SentimentClassifierConfig.from_dict(config.to_dict()) == config


def test_one_training_step_moves_every_weight():
    ids = token_ids(np.random.default_rng(3), [10, 7, 5, 9])
    labels = np.array([1, 0, 1, 0], "float32")
    layer_checks.assert_fit_one_step(build_sentiment_classifier(TINY), ids, labels, loss="binary_crossentropy")


def test_mixed_precision_stays_close_to_float32():
    ids = token_ids(np.random.default_rng(4), [10, 7, 2, 0])
    layer_checks.assert_mixed_precision_close(lambda: build_sentiment_classifier(TINY), ids)


def test_hashed_bigrams_match_numpy():
    ids = token_ids(np.random.default_rng(5), [10, 4, 1, 0])
    layer = HashedBigramEmbedding(num_buckets=97, output_dim=3)
    embedded = keras.ops.convert_to_numpy(layer(ids))
    expected_ids, expected_mask = numpy_bigrams(ids, layer.multiplier, 97)
    table = keras.ops.convert_to_numpy(layer.embedding.embeddings)
    np.testing.assert_array_equal(embedded, table[expected_ids])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.compute_mask(ids)), expected_mask)


def test_hashed_bigrams_without_int32_overflow_at_the_largest_ids():
    layer = HashedBigramEmbedding(num_buckets=2**18, output_dim=2)
    ids = np.array([[71_000, 70_999, 1, 71_000]], "int32")
    hashed, _ = layer.bigram_ids(ids)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(hashed), numpy_bigrams(ids, layer.multiplier, 2**18)[0])


def test_bad_configuration_names_the_value():
    with pytest.raises(ValueError, match="pooling=\\('median',\\)"):
        SentimentClassifierConfig(pooling=("median",))
    with pytest.raises(ValueError, match="bigram_buckets=-1"):
        SentimentClassifierConfig(bigram_buckets=-1)
    with pytest.raises(ValueError, match="num_buckets=0"):
        HashedBigramEmbedding(num_buckets=0, output_dim=2)
    with pytest.raises(ValueError, match=r"token_ids.shape=\(2, 3, 4\)"):
        HashedBigramEmbedding(num_buckets=5, output_dim=2)(np.zeros((2, 3, 4), "int32"))
