import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attn import SinusoidalPositionEncoding
from tests import layer_checks
from tests import reference
from tests.layer_checks import run_layer_test


def encoding_of(layer, length, features, start_index=0):
    """The encoding alone: what the layer adds to zeros."""
    zeros = np.zeros((1, length, features), "float32")
    return keras.ops.convert_to_numpy(layer(zeros, start_index=start_index))[0].astype(np.float64)


@settings(max_examples=8, deadline=None)
@given(
    length=st.integers(1, 40),
    features=st.integers(1, 12),
    start_index=st.integers(0, 50),
    max_wavelength=st.sampled_from([100, 10000]),
)
def test_add_matches_numpy_reference(length, features, start_index, max_wavelength):
    inputs = np.random.default_rng(length).standard_normal((2, length, features)).astype("float32")
    layer = SinusoidalPositionEncoding(max_wavelength=max_wavelength)
    expected = inputs + reference.sinusoidal_encoding(start_index + length, features, max_wavelength)[start_index:]
    got = keras.ops.convert_to_numpy(layer(inputs, start_index=start_index))
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_concat_appends_encoding_dim_features():
    inputs = np.random.default_rng(0).standard_normal((2, 9, 6)).astype("float32")
    got = keras.ops.convert_to_numpy(SinusoidalPositionEncoding(merge_mode="concat", encoding_dim=4)(inputs))
    assert got.shape == (2, 9, 10)
    np.testing.assert_array_equal(got[..., :6], inputs)
    np.testing.assert_allclose(got[0, :, 6:], reference.sinusoidal_encoding(9, 4), atol=1e-6)
    np.testing.assert_allclose(got[1, :, 6:], reference.sinusoidal_encoding(9, 4), atol=1e-6)
    default = SinusoidalPositionEncoding(merge_mode="concat")
    assert default(inputs).shape == (2, 9, 12)
    assert default.compute_output_shape((None, None, 6)) == (None, None, 12)


def test_any_length_no_maximum():
    """Long sequences are computed on the fly; float32 angles lose ~1 ulp of the position."""
    encoding = encoding_of(SinusoidalPositionEncoding(), 6000, 8)
    np.testing.assert_allclose(encoding, reference.sinusoidal_encoding(6000, 8), atol=2e-3)
    np.testing.assert_allclose(encoding[:500], reference.sinusoidal_encoding(500, 8), atol=1e-4)


@pytest.mark.parametrize("offset", [1, 5, 17])
def test_shift_is_one_fixed_rotation_for_every_position(offset):
    """p[t + k] = R_k p[t] for all t with one orthogonal R_k (fitted by least squares).

    A short max_wavelength makes even the slowest sinusoid turn over several periods, so the
    least-squares fit is well conditioned.
    """
    encoding = encoding_of(SinusoidalPositionEncoding(max_wavelength=100), 300, 8)
    before, after = encoding[:-offset], encoding[offset:]
    rotation, *_ = np.linalg.lstsq(before, after, rcond=None)  # after ~= before @ rotation
    np.testing.assert_allclose(before @ rotation, after, atol=1e-5)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(8), atol=1e-4)


def test_mask_passes_through():
    token_ids = np.array([[3, 4, 0], [5, 0, 0]])
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(tokens)
    encoded = SinusoidalPositionEncoding()(embedded)
    np.testing.assert_array_equal(keras.Model(tokens, encoded._keras_mask)(token_ids), token_ids != 0)
    model = keras.Model(tokens, keras.layers.GlobalAveragePooling1D()(encoded))
    pooled = keras.ops.convert_to_numpy(model(token_ids))
    vectors = keras.ops.convert_to_numpy(keras.Model(tokens, encoded)(token_ids))
    np.testing.assert_allclose(pooled[1], vectors[1, 0], atol=1e-6)  # only the real position counts


def model_factory(merge_mode):
    def factory():
        inputs = keras.Input((None, 6))
        outputs = SinusoidalPositionEncoding(merge_mode=merge_mode)(inputs)
        return keras.Model(inputs, keras.layers.Dense(3)(outputs))

    return factory


@pytest.mark.parametrize("merge_mode", ["add", "concat"])
def test_serialization_mixed_precision_jit(merge_mode):
    inputs = np.random.default_rng(1).standard_normal((2, 5, 6)).astype("float32")
    layer_checks.assert_serialization_round_trip(model_factory(merge_mode), inputs)
    layer_checks.assert_mixed_precision_close(model_factory(merge_mode), inputs)
    layer_checks.assert_jit_matches_eager(model_factory(merge_mode)(), inputs)
    layer_checks.assert_config_round_trip(SinusoidalPositionEncoding(merge_mode, 500, None))


def test_gradients_and_fit():
    inputs = np.random.default_rng(2).standard_normal((2, 4, 6)).astype("float32")
    layer_checks.assert_gradients_match_finite_differences(model_factory("concat"), inputs)
    layer_checks.assert_fit_one_step(model_factory("add")(), inputs, np.zeros((2, 4, 3), "float32"))


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="merge_mode='sum'"):
        SinusoidalPositionEncoding(merge_mode="sum")
    with pytest.raises(ValueError, match="max_wavelength=0"):
        SinusoidalPositionEncoding(max_wavelength=0)
    with pytest.raises(ValueError, match="encoding_dim=-2"):
        SinusoidalPositionEncoding(merge_mode="concat", encoding_dim=-2)
    with pytest.raises(ValueError, match="encoding_dim=4"):
        SinusoidalPositionEncoding(encoding_dim=4)(np.zeros((1, 3, 6), "float32"))
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3\)"):
        SinusoidalPositionEncoding()(np.zeros((2, 3), "float32"))


@pytest.mark.parametrize("merge_mode", ["add", "concat"])
def test_layer_contract(merge_mode):
    rng = np.random.default_rng(18)
    run_layer_test(
        SinusoidalPositionEncoding,
        dict(merge_mode=merge_mode),
        rng.standard_normal((2, 5, 6)).astype("float32"),
        expected_num_trainable_weights=0,
        run_training=False,
    )
