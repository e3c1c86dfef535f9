import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attn import RotaryEmbedding
from tests import layer_checks
from tests import reference
from tests.layer_checks import run_layer_test


@settings(max_examples=8, deadline=None)
@given(
    length=st.integers(1, 12),
    half_depth=st.integers(1, 6),
    start_index=st.integers(0, 100),
    scaling_factor=st.sampled_from([1.0, 4.0]),
)
def test_matches_numpy_reference(length, half_depth, start_index, scaling_factor):
    inputs = np.random.default_rng(length).standard_normal((2, length, 3, 2 * half_depth)).astype("float32")
    layer = RotaryEmbedding(max_wavelength=500, scaling_factor=scaling_factor)
    expected = reference.rotary_embedding(inputs, start_index, 500, scaling_factor)
    got = keras.ops.convert_to_numpy(layer(inputs, start_index=start_index))
    np.testing.assert_allclose(got, expected, atol=2e-5)


def rotate_one(layer, vector, position):
    """`vector` `(heads, depth)` rotated as the token at `position`."""
    return keras.ops.convert_to_numpy(layer(vector[None, None], start_index=position))[0, 0].astype(np.float64)


@settings(max_examples=10, deadline=None)
@given(query_position=st.integers(0, 150), key_position=st.integers(0, 150), shift=st.integers(1, 100))
def test_query_key_product_depends_only_on_relative_offset(query_position, key_position, shift):
    rng = np.random.default_rng(query_position)
    query, key = rng.standard_normal((2, 2, 8)).astype("float32")
    layer = RotaryEmbedding()
    product = np.sum(rotate_one(layer, query, query_position) * rotate_one(layer, key, key_position), -1)
    shifted = np.sum(
        rotate_one(layer, query, query_position + shift) * rotate_one(layer, key, key_position + shift), -1
    )
    np.testing.assert_allclose(shifted, product, atol=1e-4)
    # A rotation keeps norms: the per-head product at offset 0 is the plain dot product.
    same = np.sum(rotate_one(layer, query, key_position) * rotate_one(layer, key, key_position), -1)
    np.testing.assert_allclose(same, np.sum(query.astype(np.float64) * key, -1), atol=1e-4)


def test_sequence_equals_position_by_position():
    inputs = np.random.default_rng(0).standard_normal((2, 6, 2, 8)).astype("float32")
    layer = RotaryEmbedding()
    whole = keras.ops.convert_to_numpy(layer(inputs, start_index=3))
    for t in range(6):
        step = keras.ops.convert_to_numpy(layer(inputs[:, t : t + 1], start_index=3 + t))
        np.testing.assert_allclose(step[:, 0], whole[:, t], atol=1e-6)


def model_factory():
    inputs = keras.Input((None, 2, 4))
    rotated = RotaryEmbedding(max_wavelength=100)(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(rotated))


def test_serialization_mixed_precision_jit_gradients_fit():
    inputs = np.random.default_rng(1).standard_normal((2, 5, 2, 4)).astype("float32")
    layer_checks.assert_serialization_round_trip(model_factory, inputs)
    layer_checks.assert_config_round_trip(RotaryEmbedding(max_wavelength=500, scaling_factor=2.0))
    layer_checks.assert_mixed_precision_close(model_factory, inputs)
    layer_checks.assert_jit_matches_eager(model_factory(), inputs)
    layer_checks.assert_gradients_match_finite_differences(model_factory, inputs)
    layer_checks.assert_fit_one_step(model_factory(), inputs, np.zeros((2, 5, 2, 3), "float32"))


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="max_wavelength=1"):
        RotaryEmbedding(max_wavelength=1)
    with pytest.raises(ValueError, match="scaling_factor=0"):
        RotaryEmbedding(scaling_factor=0)
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3, 5\)"):
        RotaryEmbedding()(np.zeros((2, 3, 5), "float32"))
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3, 1, 5\)"):
        RotaryEmbedding()(np.zeros((2, 3, 1, 5), "float32"))


def test_layer_contract():
    rng = np.random.default_rng(17)
    run_layer_test(
        RotaryEmbedding,
        dict(max_wavelength=100),
        rng.standard_normal((2, 5, 2, 4)).astype("float32"),
        expected_num_trainable_weights=0,
        run_training=False,
    )
