"""SparseLinear against NumPy: a dense matrix product on the scattered vector."""

import keras
import numpy as np
import pytest

from models.sparse_linear import SparseLinear
from tests import layer_checks
from tests.layer_checks import run_layer_test


def sparse_inputs(rng, batch=3, entries=6, num_features=11):
    features = rng.integers(0, num_features, size=(batch, entries)).astype("int32")
    features[0, :2] = 4  # a repeated id adds up
    return features, rng.standard_normal((batch, entries)).astype("float32")


def test_matches_dense_on_the_scattered_vector():
    rng = np.random.default_rng(0)
    features, values = sparse_inputs(rng)
    layer = SparseLinear(11, units=2, bias_initializer="random_normal")
    output = keras.ops.convert_to_numpy(layer((features, values)))
    dense = np.zeros((3, 11))
    for row in range(3):
        np.add.at(dense[row], features[row], values[row].astype(np.float64))
    kernel, bias = (keras.ops.convert_to_numpy(w).astype(np.float64) for w in layer.weights)
    np.testing.assert_allclose(output, dense @ kernel + bias, atol=1e-6)


def test_serializes_compiles_and_trains():
    rng = np.random.default_rng(1)
    features = keras.Input((None,), dtype="int32")
    values = keras.Input((None,))
    model = keras.Model([features, values], SparseLinear(11)((features, values)))
    inputs = list(sparse_inputs(rng))
    layer_checks.assert_serialization_round_trip(model, inputs)
    layer_checks.assert_jit_matches_eager(model, inputs)
    layer_checks.assert_fit_one_step(model, inputs, np.ones((3, 1), "float32"))


def test_bad_arguments_and_inputs_name_the_value():
    with pytest.raises(ValueError, match="num_features=0"):
        SparseLinear(0)
    with pytest.raises(ValueError, match="units=1.5"):
        SparseLinear(5, units=1.5)
    with pytest.raises(ValueError, match=r"values.shape=\(3, 5\)"):
        SparseLinear(11)((np.zeros((3, 6), "int32"), np.zeros((3, 5), "float32")))


def test_layer_contract():
    features = np.array([[3, 9, 1], [0, 4, 4]], "int32")
    values = np.array([[0.5, 1.0, 0.25], [0.0, 2.0, -1.0]], "float32")
    run_layer_test(SparseLinear, dict(num_features=10, units=2), [features, values], expected_num_trainable_weights=2)
