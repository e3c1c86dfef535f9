"""ALiBi against the paper: its slopes and its bias `-slope_h * |i - j|` (float64 NumPy references)."""

import numpy as np
import pytest

from keras_attn import ALiBi
from keras_attn.positions.alibi import alibi_slopes
from tests import reference
from tests.layer_checks import run_layer_test


def test_eight_heads_have_slopes_one_half_to_one_256th():
    np.testing.assert_array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))


def test_other_head_counts_interleave_as_the_papers_code():
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope: 2^-1, 2^-3.
    np.testing.assert_array_equal(alibi_slopes(6), 2.0 ** -np.array([2, 4, 6, 8, 1, 3]))
    # 12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from the 16-head ones.
    np.testing.assert_allclose(alibi_slopes(12), 2.0 ** -np.array([1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]))
    for num_heads in range(1, 40):
        np.testing.assert_allclose(alibi_slopes(num_heads), reference.alibi_slopes(num_heads), rtol=1e-12)


@pytest.mark.parametrize("num_heads", [1, 5, 8])
def test_bias_matches_the_reference_with_offsets_and_batched_positions(num_heads):
    query_positions, key_positions = np.arange(7, 12), np.arange(14)
    got = ALiBi(num_heads)(query_positions, key_positions)
    np.testing.assert_allclose(got, reference.alibi_bias(num_heads, query_positions, key_positions), rtol=1e-6)
    batched = ALiBi(num_heads)(np.stack([query_positions, query_positions - 7]), np.stack([key_positions] * 2))
    assert tuple(batched.shape) == (2, num_heads, 5, 14)
    np.testing.assert_allclose(batched[1], reference.alibi_bias(num_heads, query_positions - 7, key_positions)[0])


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        ALiBi(0)
    with pytest.raises(ValueError, match="query_positions"):
        ALiBi(2)(np.zeros((3,), "float32"), np.arange(3))
    with pytest.raises(ValueError, match="key_positions"):
        ALiBi(2)(np.arange(3), np.zeros((1, 2, 3), "int32"))


def test_layer_contract():
    positions = np.tile(np.arange(6, dtype="int32"), (2, 1))
    run_layer_test(
        ALiBi, dict(num_heads=4), (positions + 3, positions), expected_num_trainable_weights=0, run_training=False
    )
