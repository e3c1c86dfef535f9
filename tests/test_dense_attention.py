"""The dense kernel's hard (argmax) attention against its float64 NumPy definition (tests/reference.py)."""

import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.dispatch import attention as attention_module
from keras_attn.dispatch import cost_model
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall
from keras_attn.patterns import Causal
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference
from tests.kernel_registry import kernels_refusing
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import output_gradients

BATCH, QUERY_LEN, KEY_LEN, HEADS, DEPTH = 2, 5, 6, 3, 4
CAUSAL = np.tril(np.ones((QUERY_LEN, KEY_LEN), bool))


def _qkv(rng, dtype="float64", kv_heads=HEADS):
    query = rng.standard_normal((BATCH, QUERY_LEN, HEADS, DEPTH)).astype(dtype)
    key = rng.standard_normal((BATCH, KEY_LEN, kv_heads, DEPTH)).astype(dtype)
    value = rng.standard_normal((BATCH, KEY_LEN, kv_heads, DEPTH)).astype(dtype)
    return query, key, value


def _mask_with_an_empty_row(rng):
    mask = rng.random((BATCH, 1, QUERY_LEN, KEY_LEN)) < 0.6
    mask[0, 0, 2] = False  # a query row without any allowed key
    return mask


def _gap_to_second(logits):
    """Each row's largest logit minus its second (`inf` with one allowed key, `nan` with none)."""
    ordered = np.sort(logits, axis=-1)
    with np.errstate(invalid="ignore"):  # -inf - -inf in a row without keys
        return ordered[..., -1] - ordered[..., -2]


@pytest.mark.parametrize("kv_heads", [HEADS, 1])
def test_hard_output_gathers_the_value_of_the_argmax_allowed_key(kv_heads):
    rng = np.random.default_rng(0)
    query, key, value = _qkv(rng, kv_heads=kv_heads)
    mask = _mask_with_an_empty_row(rng)
    bias = rng.standard_normal((1, HEADS, QUERY_LEN, KEY_LEN))
    output, weights = scaled_dot_product_attention(
        query, key, value, mask=mask, bias=bias, is_causal=True, scale=0.8, hard=True, return_weights=True
    )
    expected, expected_weights = reference.hard_attention(query, key, value, mask, bias, is_causal=True, scale=0.8)
    np.testing.assert_array_equal(np.asarray(weights), expected_weights)
    np.testing.assert_allclose(np.asarray(output), expected, rtol=0, atol=1e-12)
    # The same definition written as a gather: the value at the argmax of the allowed logits.
    key, value = (np.repeat(t, HEADS // kv_heads, axis=2) for t in (key, value))
    allowed = mask & CAUSAL  # (batch, 1, query_len, key_len)
    logits = np.where(allowed, 0.8 * np.einsum("bqhd,bkhd->bhqk", query, key) + bias, -np.inf)
    chosen = np.argmax(logits, axis=-1)  # (batch, heads, query_len)
    gathered = np.take_along_axis(value.transpose(0, 2, 1, 3), chosen[..., None], axis=2)  # (b, h, q, depth)
    has_keys = allowed.any(axis=-1)[..., None]  # (batch, 1, query_len, 1)
    gathered = np.where(has_keys, gathered, 0.0).transpose(0, 2, 1, 3)  # (batch, query_len, heads, depth)
    np.testing.assert_allclose(np.asarray(output), gathered, rtol=0, atol=1e-12)
    assert not np.asarray(output)[0, 2].any() and not np.asarray(weights)[0, :, 2].any()  # the empty row


def test_ties_select_the_lowest_key_index():
    key = np.zeros((1, 4, 1, 2))
    key[0, 1, 0] = key[0, 3, 0] = [1.0, 0.0]  # keys 1 and 3 tie on the largest logit
    value = np.arange(4, dtype=np.float64).reshape(1, 4, 1, 1) * np.ones((1, 1, 1, 2))
    query = np.array([[[[2.0, 0.0]]]])
    output, weights = scaled_dot_product_attention(query, key, value, hard=True, return_weights=True)
    np.testing.assert_array_equal(np.asarray(weights)[0, 0, 0], [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(output)[0, 0, 0], [1.0, 1.0])
    every_key_ties = scaled_dot_product_attention(np.zeros_like(query), key, value, hard=True)
    np.testing.assert_array_equal(np.asarray(every_key_ties)[0, 0, 0], [0.0, 0.0])  # key 0's value


def test_soft_weights_converge_to_the_hard_ones_as_the_inverse_temperature_grows():
    rng = np.random.default_rng(1)
    query, key, value = _qkv(rng)
    _, hard = reference.hard_attention(query, key, value, is_causal=True)
    gaps = _gap_to_second(np.where(CAUSAL, np.einsum("bqhd,bkhd->bhqk", query, key), -np.inf))
    gap = np.min(gaps)
    assert gap > 1e-3  # no near-tie in this draw: the limit is the one-hot weights
    distances = []
    for beta in (0.5, 5.0, 50.0, 20.0 / gap):
        _, soft = scaled_dot_product_attention(query, key, value, is_causal=True, scale=beta, return_weights=True)
        distances.append(np.max(np.abs(np.asarray(soft) - hard)))
    assert all(later <= earlier for earlier, later in zip(distances, distances[1:])), distances
    # every other weight is at most exp(-beta * gap) = exp(-20), so the argmax's is 1 - 5 exp(-20)
    assert distances[-1] <= (KEY_LEN - 1) * np.exp(-20.0) + 1e-12, distances


def test_gradients_are_straight_through_as_the_reference_defines_them():
    rng = np.random.default_rng(2)
    query, key, value = _qkv(rng)
    mask = _mask_with_an_empty_row(rng)
    bias = rng.standard_normal((1, HEADS, QUERY_LEN, KEY_LEN))
    output_grad = rng.standard_normal((BATCH, QUERY_LEN, HEADS, DEPTH))

    def attend(query, key, value, bias):
        return scaled_dot_product_attention(
            query, key, value, mask=mask, bias=bias, is_causal=True, scale=0.7, hard=True
        )

    actual = output_gradients(attend, (query, key, value, bias), output_grad)
    expected = reference.hard_attention_gradients(query, key, value, output_grad, mask, bias, True, 0.7)
    for name, got, want in zip(("query", "key", "value", "bias"), actual, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=name)
        assert np.abs(want).max() > 0.1, name  # the comparison is not between zeros
    assert not actual[0][0, 2].any()  # the empty row passes no gradient back


def test_jit_compiled_hard_attention_equals_eager():
    rng = np.random.default_rng(3)
    query, key, value = _qkv(rng, "float32")
    mask = _mask_with_an_empty_row(rng)

    def attend(query, key, value):
        return scaled_dot_product_attention(
            query, key, value, mask=mask, is_causal=True, hard=True, return_weights=True
        )

    assert_jit_matches_eager(attend, (query, key, value), atol=1e-6)


@pytest.mark.parametrize("dtype, atol", [("float16", 1e-2), ("bfloat16", 4e-2)])
def test_mixed_precision_hard_attention_is_finite_and_picks_the_float32_argmax(dtype, atol):
    rng = np.random.default_rng(4)
    query, key, value = _qkv(rng, "float32")
    mask = _mask_with_an_empty_row(rng)
    half = [tf.cast(t, dtype) for t in (query, key, value)]
    output, weights = scaled_dot_product_attention(*half, mask=mask, hard=True, return_weights=True)
    assert output.dtype == dtype and weights.dtype == dtype
    output, weights = (tf.cast(t, "float32").numpy() for t in (output, weights))
    assert np.isfinite(output).all()
    expected, expected_weights = reference.hard_attention(query, key, value, mask)
    gaps = _gap_to_second(np.where(mask, np.einsum("bqhd,bkhd->bhqk", query, key) / 2.0, -np.inf))
    clear = np.nan_to_num(gaps) > 0.1  # (batch, heads, query_len): rounding cannot change the argmax
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(weights[clear], expected_weights[clear])
    rows = clear.transpose(0, 2, 1)  # (batch, query_len, heads)
    np.testing.assert_allclose(output[rows], expected[rows], atol=atol)


@pytest.mark.parametrize("implementation", kernels_refusing(pattern=Causal(), hard=True))
def test_streaming_kernels_refuse_hard_attention_naming_it(implementation):
    query, key, value = _qkv(np.random.default_rng(5), "float32")
    message = f"`implementation={implementation!r}` needs `hard=False`"
    with pytest.raises(ValueError, match=re.escape(message) + ".*Received: hard=True"):
        scaled_dot_product_attention(query, key, value, is_causal=True, hard=True, implementation=implementation)


@pytest.mark.parametrize("query_len", [512, 8192])
def test_auto_takes_the_dense_kernel_for_hard_attention(query_len):
    query = keras.KerasTensor((1, query_len, 4, 8))
    call = AttentionCall(query, query, query, pattern=Causal(), hard=True)
    assert attention_module._choose_implementation("auto", call) == "dense"
    assert [c.name for c in cost_model.explain(call).candidates if not c.unsupported] == ["dense"]
    soft = AttentionCall(query, query, query, pattern=Causal())
    assert len([c for c in cost_model.explain(soft).candidates if not c.unsupported]) > 1  # the others take it soft


def test_hard_must_be_a_bool():
    query, key, value = _qkv(np.random.default_rng(6), "float32")
    with pytest.raises(ValueError, match="hard=1"):
        scaled_dot_product_attention(query, key, value, hard=1)


@pytest.mark.parametrize("query_len, key_len", [(0, 0), (0, 3), (3, 1), (4, 6)])
def test_grouped_heads_match_the_reference_at_every_length_empty_included(query_len, key_len):
    rng = np.random.default_rng(7)
    query = rng.standard_normal((2, query_len, 4, 3))
    key, value = rng.standard_normal((2, key_len, 2, 3)), rng.standard_normal((2, key_len, 2, 5))
    output = scaled_dot_product_attention(query, key, value, implementation="dense")
    expected, _ = reference.attention(query, key, value)  # key head h // 2 for query head h
    np.testing.assert_allclose(output, expected, atol=1e-6)


def test_a_row_with_one_key_warns_nothing():
    rng = np.random.default_rng(8)
    query, key = rng.standard_normal((1, 1, 2, 4), "float32"), rng.standard_normal((1, 1, 2, 4), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keras.ops.softmax warns over an axis of size 1
        output = scaled_dot_product_attention(query, key, key, implementation="dense")
    np.testing.assert_allclose(output, key, atol=1e-6)


PATTERN = Causal() & (SlidingWindow(2) | Strided(2))  # one every kernel takes


@pytest.mark.parametrize("jit_compile", [None, False, True], ids=["eager", "graph", "xla"])
@pytest.mark.parametrize("implementation", [*KERNELS, "auto"])
def test_an_empty_query_or_key_gives_an_empty_or_zero_output_or_the_kernels_reason(implementation, jit_compile):
    """No work: `auto` answers with zeros (an empty output for an empty query); a named kernel
    answers the same or says, by name, that it needs a query or a key."""
    for query_len, key_len in [(0, 0), (0, 4), (3, 0)]:
        query = np.ones((1, query_len, 4, 4), "float32")  # grouped heads: 4 query heads, 2 key heads
        key = value = np.ones((1, key_len, 2, 4), "float32")

        def attend(query, key, value):
            return scaled_dot_product_attention(query, key, value, implementation=implementation, pattern=PATTERN)

        run = attend if jit_compile is None else tf.function(attend, jit_compile=jit_compile)
        try:
            output = run(query, key, value)
        except ValueError as error:
            assert implementation != "auto" and re.search(r"needs at least one (query|key)", str(error)), error
            continue
        np.testing.assert_array_equal(output, np.zeros((1, query_len, 4, 4)))
