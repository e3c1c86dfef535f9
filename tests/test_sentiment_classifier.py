import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from models import sentiment_classifier
from models.sentiment_classifier import ATTENTION_INPUTS
from models.sentiment_classifier import BRANCHES
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import adapt_ngram_weights
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import fit_ensemble
from models.sentiment_classifier import training_model
from tests import layer_checks

TINY = SentimentClassifierConfig(
    vocabulary_size=50,
    max_tokens=16,
    sequence_length=6,
    embedding_dim=8,
    num_layers=2,
    num_heads=2,
    intermediate_dim=16,
    dropout=0.1,
    bigram_buckets=97,
)


def token_ids(rng, lengths, width=10):
    return layer_checks.padded_token_ids(rng, lengths, width, TINY.vocabulary_size)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def branch_logits(model, ids):
    """`(attention, ngram)` logits, each `(batch, 1)`."""
    logits = keras.Model(model.input, [model.get_layer(f"{b}_logit").output for b in BRANCHES])(ids)
    return tuple(keras.ops.convert_to_numpy(t) for t in logits)


def test_output_is_a_probability_per_review():
    ids = token_ids(np.random.default_rng(0), [10, 4, 1, 0])
    probability = keras.ops.convert_to_numpy(build_sentiment_classifier(TINY)(ids))
    assert probability.shape == (4, 1) and probability.dtype == np.float32
    assert np.all((probability > 0) & (probability < 1))


def test_prediction_weighs_the_branch_logits_and_training_sees_each_branch():
    model = build_sentiment_classifier(TINY)
    ids = token_ids(np.random.default_rng(6), [10, 5, 1, 0])
    attention_logit, ngram_logit = branch_logits(model, ids)
    outputs = {k: keras.ops.convert_to_numpy(v) for k, v in training_model(model)(ids).items()}
    assert sorted(outputs) == sorted([*BRANCHES, "probability"])
    np.testing.assert_allclose(outputs["attention"], sigmoid(attention_logit), atol=1e-6)
    np.testing.assert_allclose(outputs["ngram"], sigmoid(ngram_logit), atol=1e-6)
    # Before `fit_ensemble` the ensemble is the mean of the logits.
    expected = sigmoid((attention_logit + ngram_logit) / 2)
    np.testing.assert_allclose(outputs["probability"], expected, atol=1e-6)
    model.get_layer("ensemble").set_weights([np.array([[0.25], [1.5]], "float32"), np.array([-0.5], "float32")])
    expected = sigmoid(0.25 * attention_logit + 1.5 * ngram_logit - 0.5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(ids)), expected, atol=1e-6)
    assert len(training_model(model).weights) == len(model.weights)


def test_attention_reads_the_first_sequence_length_tokens_and_the_ngrams_all_of_them():
    model = build_sentiment_classifier(TINY)
    ids = token_ids(np.random.default_rng(7), [10, 9])
    changed = ids.copy()
    changed[:, TINY.sequence_length :] = np.flip(changed[:, TINY.sequence_length :], axis=1) % 40 + 2
    (attention, ngram), (changed_attention, changed_ngram) = branch_logits(model, ids), branch_logits(model, changed)
    np.testing.assert_allclose(changed_attention, attention, atol=1e-6)
    assert np.all(np.abs(changed_ngram - ngram) > 1e-6)


def test_fit_ensemble_fits_only_the_ensemble_weights_on_the_given_batches():
    model = build_sentiment_classifier(TINY)
    rng = np.random.default_rng(8)
    ids = token_ids(rng, rng.integers(2, 11, size=64))
    attention_logit, ngram_logit = branch_logits(model, ids)
    labels = (ngram_logit[:, 0] > np.median(ngram_logit)).astype("float32")  # the n-gram branch is right
    others = {w.path: w.numpy().copy() for w in model.weights if "ensemble" not in w.path}

    fitted = fit_ensemble(model, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(16), l2=1e-3)

    assert all(np.array_equal(w.numpy(), others[w.path]) for w in model.weights if w.path in others)
    kernel, bias = fitted["kernel"], fitted["bias"]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(ids)),
        sigmoid(kernel[0] * attention_logit + kernel[1] * ngram_logit + bias),
        atol=1e-5,
    )
    assert abs(kernel[1]) > abs(kernel[0])
    assert np.mean((keras.ops.convert_to_numpy(model(ids))[:, 0] > 0.5) == labels) >= 0.95


def test_logistic_regression_reaches_the_optimum():
    """The fitted weights zero the gradient of the penalised log loss (the optimality condition)."""
    rng = np.random.default_rng(9)
    features = rng.standard_normal((200, 2)) * [3.0, 1.0]
    labels = (features @ [0.4, 1.2] + rng.standard_normal(200) > 0).astype(np.float64)
    weights = sentiment_classifier._logistic_regression(features, labels, l2=2.0)
    design = np.concatenate([features, np.ones((200, 1))], axis=1)
    gradient = design.T @ (sigmoid(design @ weights) - labels) + [2.0 * weights[0], 2.0 * weights[1], 0.0]
    np.testing.assert_allclose(gradient, 0.0, atol=1e-8)
    assert weights[1] > weights[0] > 0


@pytest.mark.parametrize("attention_bigram_buckets", [0, 13])
def test_padding_does_not_change_the_prediction(attention_bigram_buckets):
    model = build_sentiment_classifier(dataclasses.replace(TINY, attention_bigram_buckets=attention_bigram_buckets))
    ids = token_ids(np.random.default_rng(1), [10, 6, 2, 0])
    padded = np.pad(ids, [(0, 0), (0, 6)])  # up to max_tokens
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(padded)), keras.ops.convert_to_numpy(model(ids)), atol=1e-6
    )
    alone = [keras.ops.convert_to_numpy(model(ids[i : i + 1, : max(n, 1)])) for i, n in enumerate([10, 6, 2, 0])]
    np.testing.assert_allclose(np.concatenate(alone), keras.ops.convert_to_numpy(model(ids)), atol=1e-6)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"pooling": ("max",), "position_encoding": "sinusoidal", "max_tokens": 6},
        {"attention_inputs": "ngrams"},
        {"attention_inputs": "ngrams", "bigram_ids": "vocabulary"},
    ],
)
def test_configurations_serialize_and_compile(changes):
    config = dataclasses.replace(TINY, **changes)
    ids = token_ids(np.random.default_rng(2), [10, 3, 0])
    layer_checks.assert_serialization_round_trip(lambda: build_sentiment_classifier(config), ids)
    layer_checks.assert_jit_matches_eager(build_sentiment_classifier(config), ids, training=False)
    assert SentimentClassifierConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("attention_inputs", ATTENTION_INPUTS)
def test_one_training_step_moves_every_weight(attention_inputs):
    ids = token_ids(np.random.default_rng(3), [10, 7, 5, 9])
    labels = np.array([1, 0, 1, 0], "float32")
    model = build_sentiment_classifier(dataclasses.replace(TINY, attention_inputs=attention_inputs))
    layer_checks.assert_fit_one_step(model, ids, labels, loss="binary_crossentropy")


@pytest.mark.parametrize("bigram_ids", ["hashed", "vocabulary"])
def test_ngram_attention_reads_the_whole_review_weighted_by_the_bags_feature_weights(bigram_ids):
    config = dataclasses.replace(TINY, attention_inputs="ngrams", bigram_ids=bigram_ids)
    model = build_sentiment_classifier(config)
    rng = np.random.default_rng(6)
    ids = token_ids(rng, [10, 9, 9, 10, 9, 10])
    labels = np.array([1, 0, 1, 0, 1, 0])
    adapt_ngram_weights(model, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(3))
    bag_weights = keras.ops.convert_to_numpy(model.get_layer("ngram_bag").feature_weights)
    assert np.ptp(bag_weights) > 0  # naive-Bayes ratios learnt, not the initial ones
    embedding = model.get_layer("weighted_ngram_embedding")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(embedding.feature_weights), bag_weights)
    if bigram_ids == "vocabulary":  # learnt (not the initial padding keys) and shared
        bag_vocabulary = keras.ops.convert_to_numpy(model.get_layer("ngram_bag").bigram_vocabulary)
        assert bag_vocabulary.min() < np.iinfo(np.int32).max
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(embedding.bigram_vocabulary), bag_vocabulary)
    # Beyond sequence_length the "tokens" branch is blind; this one is not.
    changed = ids.copy()
    position = config.sequence_length + 1
    changed[:, position] = np.where(ids[:, position] == 7, 8, 7)
    before, after = branch_logits(model, ids)[0], branch_logits(model, changed)[0]
    assert np.all(np.abs(after - before) > 1e-6)


def test_a_token_encoder_checkpoint_does_not_fit_the_ngram_attention_branch(tmp_path):
    from pipelines import encoder_checkpoint

    checkpoint = encoder_checkpoint.EncoderCheckpoint(tmp_path, TINY, ["a", "b"], {})
    encoder_checkpoint.check_fits(checkpoint, TINY, ["a", "b"])
    with pytest.raises(ValueError, match="attention_inputs='ngrams' \\(checkpoint: 'tokens'\\)"):
        encoder_checkpoint.check_fits(checkpoint, dataclasses.replace(TINY, attention_inputs="ngrams"), ["a", "b"])


def test_mixed_precision_stays_close_to_float32():
    ids = token_ids(np.random.default_rng(4), [10, 7, 2, 0])
    layer_checks.assert_mixed_precision_close(lambda: build_sentiment_classifier(TINY), ids)


def test_bad_configuration_names_the_value():
    with pytest.raises(ValueError, match="attention_inputs='words'"):
        SentimentClassifierConfig(attention_inputs="words")
    with pytest.raises(ValueError, match="pooling=\\('median',\\)"):
        SentimentClassifierConfig(pooling=("median",))
    with pytest.raises(ValueError, match="sequence_length=600, max_tokens=512"):
        SentimentClassifierConfig(sequence_length=600, max_tokens=512)
