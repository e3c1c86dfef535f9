import keras
import numpy as np
import pytest

from keras_attn import FeedForward
from tests import layer_checks
from tests.layer_checks import run_layer_test


def numpy_feed_forward(layer, inputs, activation):
    """Float64 `activation(x W1 + b1) W2 + b2` from the layer's own weights."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in layer.get_weights())
    return activation(np.asarray(inputs, np.float64) @ w1 + b1) @ w2 + b2


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
}


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("output_dim", [None, 3])
def test_matches_numpy(activation, output_dim):
    inputs = np.random.default_rng(0).standard_normal((2, 5, 6)).astype("float32")
    layer = FeedForward(12, activation=activation, output_dim=output_dim, bias_initializer="random_normal")
    got = keras.ops.convert_to_numpy(layer(inputs))
    assert got.shape == (2, 5, output_dim or 6)
    np.testing.assert_allclose(got, numpy_feed_forward(layer, inputs, ACTIVATIONS[activation]), atol=1e-5)


def test_dropout_only_when_training():
    inputs = np.random.default_rng(1).standard_normal((4, 5, 6)).astype("float32")
    layer = FeedForward(32, dropout=0.5)
    inference = keras.ops.convert_to_numpy(layer(inputs, training=False))
    np.testing.assert_allclose(inference, numpy_feed_forward(layer, inputs, ACTIVATIONS["relu"]), atol=1e-5)
    training = keras.ops.convert_to_numpy(layer(inputs, training=True))
    assert not np.allclose(training, inference, atol=1e-3)


def test_mask_passes_through():
    token_ids = np.array([[3, 4, 0], [5, 0, 0]], "int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(token_ids)
    np.testing.assert_array_equal(FeedForward(8)(embedded)._keras_mask, token_ids != 0)
    tokens = keras.Input((None,), dtype="int32")
    symbolic = FeedForward(8)(keras.layers.Embedding(10, 4, mask_zero=True)(tokens))
    np.testing.assert_array_equal(keras.Model(tokens, symbolic._keras_mask)(token_ids), token_ids != 0)


def model_factory():
    inputs = keras.Input((None, 4))
    return keras.Model(inputs, FeedForward(8, activation="gelu", output_dim=3)(inputs))


def test_serialization_mixed_precision_jit_gradients_fit():
    inputs = np.random.default_rng(2).standard_normal((2, 5, 4)).astype("float32")
    layer_checks.assert_serialization_round_trip(model_factory, inputs)
    layer_checks.assert_config_round_trip(
        FeedForward(8, activation="tanh", dropout=0.1, output_dim=2, kernel_initializer="he_normal")
    )
    layer_checks.assert_mixed_precision_close(model_factory, inputs)
    layer_checks.assert_jit_matches_eager(model_factory(), inputs)
    layer_checks.assert_gradients_match_finite_differences(model_factory, inputs)
    layer_checks.assert_fit_one_step(model_factory(), inputs, np.zeros((2, 5, 3), "float32"))


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="intermediate_dim=0"):
        FeedForward(0)
    with pytest.raises(ValueError, match="output_dim=-1"):
        FeedForward(4, output_dim=-1)
    with pytest.raises(ValueError, match="dropout=1.5"):
        FeedForward(4, dropout=1.5)
    with pytest.raises(ValueError, match=r"inputs.shape=\(3,\)"):
        FeedForward(4)(np.zeros((3,), "float32"))


def test_layer_contract():
    rng = np.random.default_rng(15)
    run_layer_test(
        FeedForward,
        dict(intermediate_dim=16, dropout=0.1),
        rng.standard_normal((2, 5, 8)).astype("float32"),
        expected_num_trainable_weights=4,
    )
