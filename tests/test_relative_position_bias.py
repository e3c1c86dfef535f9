"""T5's relative position bias against a NumPy transcription of T5's `_relative_position_bucket`."""

import keras
import numpy as np
import pytest

from keras_attn import RelativePositionBias
from keras_attn.positions.relative_position_bias import relative_position_buckets
from tests import reference
from tests.layer_checks import run_layer_test


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (64, 1000), (6, 9)])
def test_buckets_are_t5s(bidirectional, num_buckets, max_distance):
    relative = np.arange(-3000, 3000)
    got = relative_position_buckets(relative, bidirectional, num_buckets, max_distance)
    expected = reference.t5_relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(got, expected)
    # Every bucket occurs (exact, logarithmic and clipped distances), except in T5 the first of
    # the keys-after-the-query half: distance 0 lies in the other half.
    unused = {num_buckets // 2} if bidirectional else set()
    assert set(np.unique(expected)) == set(range(num_buckets)) - unused


def test_t5_default_buckets_by_hand():
    # bidirectional, 32 buckets: 16 per direction, 8 exact distances, keys after the query from 16 on.
    got = relative_position_buckets(np.array([0, -1, -7, -8, -200, 1, 7, 200]), True, 32, 128)
    np.testing.assert_array_equal(got, [0, 1, 7, 8, 15, 17, 23, 31])
    # causal: every key after the query shares bucket 0; 16 exact distances before it.
    got = relative_position_buckets(np.array([5, 0, -1, -15, -16, -500]), False, 32, 128)
    np.testing.assert_array_equal(got, [0, 0, 1, 15, 16, 31])


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_is_the_table_at_the_buckets(bidirectional):
    layer = RelativePositionBias(3, num_buckets=10, max_distance=12, bidirectional=bidirectional)
    query_positions, key_positions = np.arange(20, 26), np.arange(30)
    got = layer(query_positions, key_positions)
    expected = reference.relative_position_bias(
        layer.table.numpy(), query_positions, key_positions, bidirectional, max_distance=12
    )
    np.testing.assert_array_equal(got, expected.astype("float32"))
    batched = layer(np.stack([query_positions, query_positions - 20]), np.stack([key_positions] * 2))
    np.testing.assert_array_equal(
        batched[1:],
        reference.relative_position_bias(
            layer.table.numpy(), query_positions - 20, key_positions, bidirectional, max_distance=12
        ).astype("float32"),
    )


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_buckets"):
        RelativePositionBias(2, num_buckets=3)
    with pytest.raises(ValueError, match="num_buckets"):
        RelativePositionBias(2, num_buckets=1, bidirectional=False)
    with pytest.raises(ValueError, match="max_distance"):
        RelativePositionBias(2, num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_heads"):
        RelativePositionBias(-1)


def test_the_table_stays_float32_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_float16")
    layer = RelativePositionBias(2)
    bias = layer(np.arange(3), np.arange(3))
    assert layer.table.dtype == "float32" and bias.dtype == "float16"
    assert keras.backend.standardize_dtype(layer.bias_parameters()[0].dtype) == "float32"


def test_layer_contract():
    positions = np.tile(np.arange(6, dtype="int32"), (2, 1))
    run_layer_test(
        RelativePositionBias,
        dict(num_heads=2, num_buckets=8, max_distance=10),
        (positions + 3, positions),
        expected_num_trainable_weights=1,
    )
