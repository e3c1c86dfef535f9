"""scaled_dot_product_attention and its mask helpers against the NumPy float64 reference."""

import functools
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_attn
from keras_attn.core.masks import causal_mask
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import padding_mask_to_attention_mask
from keras_attn.core.masks import sliding_window_mask
from keras_attn.dispatch import attention as attention_module
from keras_attn.dispatch import cost_model
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import chunked
from keras_attn.kernels import kernels_table
from keras_attn.kernels.call import AttentionCall
from keras_attn.patterns import Causal
from tests import reference
from tests.dispatch_rule import rule_choice
from tests.layer_checks import assert_gradients_match_finite_differences
from tests.layer_checks import assert_jit_matches_eager

FLOAT32_ATOL = 1e-5
HALF_TOLERANCES = {"float16": 1e-2, "bfloat16": 4e-2}
MASK_LAYOUTS = ("none", "full", "per_batch", "per_head", "keys_only", "padding")
FEW_EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _qkv(rng, batch, query_len, key_len, heads, kv_heads, depth, value_depth, dtype="float32"):
    query = rng.standard_normal((batch, query_len, heads, depth)).astype(dtype)
    key = rng.standard_normal((batch, key_len, kv_heads, depth)).astype(dtype)
    value = rng.standard_normal((batch, key_len, kv_heads, value_depth)).astype(dtype)
    return query, key, value


def _random_mask(rng, layout, batch, heads, query_len, key_len):
    """A boolean mask in one of the broadcastable layouts; random ones often mask whole rows."""
    shapes = {
        "full": (batch, heads, query_len, key_len),
        "per_batch": (batch, 1, query_len, key_len),
        "per_head": (1, heads, query_len, key_len),
        "keys_only": (batch, 1, 1, key_len),
    }
    if layout == "none":
        return None
    if layout == "padding":
        lengths = rng.integers(0, key_len + 1, size=batch)  # length 0: every row fully masked
        return (np.arange(key_len)[None, :] < lengths[:, None]).reshape(batch, 1, 1, key_len)
    return rng.random(shapes[layout]) < 0.6


@pytest.fixture
def small_query_chunks(monkeypatch):
    """Query chunks of 2 rows, so that the chunked path splits the short test sequences."""
    monkeypatch.setattr(chunked, "QUERY_CHUNK_SIZE", 2)


def _assert_matches_reference(actual, weights, expected, expected_weights, atol=FLOAT32_ATOL):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, atol=atol, rtol=0)
    np.testing.assert_allclose(np.asarray(weights, np.float64), expected_weights, atol=atol, rtol=0)


# key_len=1 examples make Keras warn that a softmax over one element is always 1 (it is).
@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@FEW_EXAMPLES
@given(
    batch=st.integers(1, 3),
    query_len=st.integers(1, 7),
    key_len=st.integers(1, 7),
    kv_heads=st.integers(1, 3),
    groups=st.integers(1, 3),
    depth=st.integers(1, 8),
    value_depth=st.integers(1, 8),
    mask_layout=st.sampled_from(MASK_LAYOUTS),
    use_bias=st.booleans(),
    is_causal=st.booleans(),
    sliding_window=st.one_of(st.none(), st.integers(1, 4)),
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
    seed=st.integers(0, 2**16),
)
def test_matches_reference(
    small_query_chunks,
    batch,
    query_len,
    key_len,
    kv_heads,
    groups,
    depth,
    value_depth,
    mask_layout,
    use_bias,
    is_causal,
    sliding_window,
    scale,
    seed,
):
    rng = np.random.default_rng(seed)
    heads = kv_heads * groups
    query, key, value = _qkv(rng, batch, query_len, key_len, heads, kv_heads, depth, value_depth)
    mask = _random_mask(rng, mask_layout, batch, heads, query_len, key_len)
    bias = rng.standard_normal((1, heads, query_len, key_len)).astype("float32") if use_bias else None
    options = dict(mask=mask, bias=bias, is_causal=is_causal, sliding_window=sliding_window, scale=scale)

    output, weights = scaled_dot_product_attention(query, key, value, return_weights=True, **options)

    expected, expected_weights = reference.attention(query, key, value, **options)
    assert tuple(output.shape) == (batch, query_len, heads, value_depth)
    assert tuple(weights.shape) == (batch, heads, query_len, key_len)
    _assert_matches_reference(output, weights, expected, expected_weights)
    # Without weights `auto` may pick the chunked or blockwise kernel: equal up to float32 rounding.
    without_weights = scaled_dot_product_attention(query, key, value, **options)
    np.testing.assert_allclose(np.asarray(without_weights, np.float64), expected, atol=FLOAT32_ATOL, rtol=0)
    implementations = ["blockwise"] + (["chunked"] if is_causal or sliding_window is not None else [])
    for implementation in implementations:
        output = scaled_dot_product_attention(query, key, value, implementation=implementation, **options)
        np.testing.assert_allclose(np.asarray(output, np.float64), expected, atol=FLOAT32_ATOL, rtol=0)


def test_causal_top_left_aligned_when_query_and_key_lengths_differ():
    rng = np.random.default_rng(0)
    for query_len, key_len in ((3, 6), (6, 3)):
        query, key, value = _qkv(rng, 2, query_len, key_len, 2, 2, 4, 4)
        output, weights = scaled_dot_product_attention(query, key, value, is_causal=True, return_weights=True)
        allowed = np.tril(np.ones((query_len, key_len), bool))
        assert np.all(weights.numpy()[..., ~allowed] == 0)
        _assert_matches_reference(output, weights, *reference.attention(query, key, value, is_causal=True))


@pytest.mark.parametrize("sliding_window", [None, 2])
def test_query_offset_matches_the_last_rows_of_the_full_pass(small_query_chunks, sliding_window):
    """The last queries at `query_offset` see exactly what they see in the full causal pass."""
    rng = np.random.default_rng(1)
    query, key, value = _qkv(rng, 2, 6, 6, 2, 2, 4, 4)
    options = dict(is_causal=True, sliding_window=sliding_window)
    full_output, full_weights = scaled_dot_product_attention(query, key, value, return_weights=True, **options)
    for offset in (0, 2, 5):
        tail = query[:, offset:]
        output, weights = scaled_dot_product_attention(
            tail, key, value, query_offset=offset, return_weights=True, **options
        )
        np.testing.assert_allclose(output, full_output.numpy()[:, offset:], atol=FLOAT32_ATOL)
        np.testing.assert_allclose(weights, full_weights.numpy()[:, :, offset:], atol=FLOAT32_ATOL)
        chunked = scaled_dot_product_attention(
            tail, key, value, query_offset=offset, implementation="chunked", **options
        )
        np.testing.assert_allclose(chunked, full_output.numpy()[:, offset:], atol=FLOAT32_ATOL)


def test_query_offset_as_a_tensor_under_jit():
    rng = np.random.default_rng(2)
    query, key, value = _qkv(rng, 1, 6, 6, 2, 2, 4, 4)
    full = scaled_dot_product_attention(query, key, value, is_causal=True).numpy()

    @tf.function(jit_compile=True)
    def last_query(offset):
        return scaled_dot_product_attention(query[:, -1:], key, value, is_causal=True, query_offset=offset)

    np.testing.assert_allclose(last_query(tf.constant(5)), full[:, -1:], atol=FLOAT32_ATOL)


def _fully_masked_case():
    """Query rows 0 and 3 of batch 0 and all rows of batch 1 see no key at all."""
    rng = np.random.default_rng(3)
    query, key, value = _qkv(rng, 2, 5, 6, 4, 2, 8, 8)
    mask = rng.random((2, 1, 5, 6)) < 0.7
    mask[0, :, [0, 3], :] = False
    mask[1] = False
    fully_masked = ~mask.any(-1)  # (batch, 1, query_len)
    return (query, key, value), mask, fully_masked


def _assert_rows_exactly_zero(output, weights, fully_masked):
    """Fully masked query rows: zero output and, when the weights were returned, zero weights."""
    output = np.asarray(output)
    query_rows = fully_masked[:, 0, :]  # (batch, query_len)
    assert np.all(output[query_rows] == 0)
    assert np.all(np.isfinite(output))
    assert np.any(output[~query_rows] != 0)
    if weights is not None:
        weights = np.asarray(weights)
        rows = np.broadcast_to(fully_masked, (weights.shape[0], weights.shape[1], weights.shape[2]))
        assert np.all(weights[rows] == 0) and np.all(np.isfinite(weights))
        assert np.any(weights[~rows] != 0)


@pytest.mark.parametrize("jit_compile", [None, True], ids=["eager", "jit"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "dropout"])
@pytest.mark.parametrize(
    "return_weights, implementation",
    [(True, "dense"), (False, "dense"), (False, "chunked"), (False, "blockwise")],
)
def test_fully_masked_rows_are_exactly_zero_on_every_path(
    small_query_chunks, jit_compile, training, return_weights, implementation
):
    inputs, mask, fully_masked = _fully_masked_case()
    attend = functools.partial(
        scaled_dot_product_attention,
        implementation=implementation,
        mask=mask,
        is_causal=True,
        dropout_rate=0.3,
        training=training,
        seed_generator=keras.random.SeedGenerator(7),
        return_weights=return_weights,
    )
    if jit_compile:
        attend = tf.function(attend, jit_compile=True)
    result = attend(*inputs)
    output = result[0] if return_weights else result
    weights = result[1] if return_weights else None  # nothing to check without returned weights
    _assert_rows_exactly_zero(output, weights, fully_masked)


def test_dropout_zeroes_or_rescales_each_weight_in_training_only():
    rng = np.random.default_rng(4)
    query, key, _ = _qkv(rng, 2, 6, 6, 2, 2, 4, 4)
    # One-hot values: output[b, q, h, k] is the (dropped-out) weight of key k, so the output
    # shows the weights that were actually applied.
    value = np.broadcast_to(np.eye(6, dtype="float32")[None, :, None, :], (2, 6, 2, 6))
    rate = 0.5
    attend = functools.partial(
        scaled_dot_product_attention,
        query,
        key,
        value,
        dropout_rate=rate,
        return_weights=True,
        seed_generator=keras.random.SeedGenerator(0),
    )
    eval_output, eval_weights = scaled_dot_product_attention(query, key, value, return_weights=True)
    eval_weights = eval_weights.numpy()
    inference_output, inference_weights = attend(training=False)
    np.testing.assert_array_equal(inference_weights, eval_weights)
    np.testing.assert_array_equal(inference_output, eval_output)
    training_output, training_weights = attend(training=True)
    # The returned weights are the normalised ones, before dropout (as Keras returns them).
    np.testing.assert_array_equal(training_weights, eval_weights)
    applied = np.transpose(training_output.numpy(), (0, 2, 1, 3))  # (batch, heads, q, k)
    dropped = applied == 0
    assert 0.2 < dropped.mean() < 0.8
    np.testing.assert_allclose(applied[~dropped], eval_weights[~dropped] / (1 - rate), rtol=1e-5)


@pytest.mark.parametrize("dtype", sorted(HALF_TOLERANCES))
def test_half_precision_inputs_softmax_in_float32(dtype):
    inputs, mask, fully_masked = _fully_masked_case()
    # Large logits: a float16 softmax/fill would overflow or turn masked rows into NaN.
    query, key, value = (keras.ops.cast(x * 4.0, dtype) for x in inputs)
    output, weights = scaled_dot_product_attention(query, key, value, mask=mask, return_weights=True)
    assert keras.backend.standardize_dtype(output.dtype) == dtype
    assert keras.backend.standardize_dtype(weights.dtype) == dtype
    output, weights = output.numpy().astype(np.float64), weights.numpy().astype(np.float64)
    _assert_rows_exactly_zero(output, weights, fully_masked)
    expected, expected_weights = reference.attention(
        *(np.asarray(x, np.float64) for x in (query, key, value)), mask=mask
    )
    tolerance = HALF_TOLERANCES[dtype]
    np.testing.assert_allclose(weights, expected_weights, atol=tolerance)
    np.testing.assert_allclose(output, expected, atol=tolerance * np.abs(expected).max())


@pytest.mark.parametrize("dtype", sorted(HALF_TOLERANCES))
def test_half_precision_bias_is_added_and_normalised_in_float32(dtype):
    """A bias of 1000 + 0.1 j: in float16/bfloat16 the 0.1 steps round away (uniform weights)."""
    key_len = 6
    query = keras.ops.zeros((1, 1, 1, 4), dtype)
    key = value = keras.ops.ones((1, key_len, 1, 4), dtype)
    bias = (1000.0 + 0.1 * np.arange(key_len, dtype="float32")).reshape(1, 1, 1, key_len)
    _, weights = scaled_dot_product_attention(query, key, value, bias=bias, return_weights=True)
    expected = reference.attention(query, key, value, bias=bias)[1]
    np.testing.assert_allclose(weights.numpy().astype(np.float64), expected, atol=HALF_TOLERANCES[dtype] / 4)


def test_jit_matches_eager_with_mask_bias_window_and_groups():
    rng = np.random.default_rng(5)
    query, key, value = _qkv(rng, 2, 5, 7, 4, 2, 8, 6)
    attend = functools.partial(
        scaled_dot_product_attention,
        mask=_random_mask(rng, "per_batch", 2, 4, 5, 7),
        bias=rng.standard_normal((2, 4, 5, 7)).astype("float32"),
        is_causal=True,
        sliding_window=3,
        return_weights=True,
    )
    assert_jit_matches_eager(attend, (query, key, value))


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(6)
    query, key, value = _qkv(rng, 2, 3, 4, 4, 2, 3, 2, dtype="float64")
    bias = rng.standard_normal((1, 4, 3, 4))
    mask = rng.random((2, 1, 3, 4)) < 0.7
    mask[0, :, 1, :] = False  # a fully masked row: zero output and zero, finite gradients

    def attend(query, key, value, bias, training=False):
        return scaled_dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            is_causal=True,
            scale=0.7,
            training=training,
            return_weights=True,
        )

    assert_gradients_match_finite_differences(lambda: attend, (query, key, value, bias))


@pytest.mark.parametrize(
    "query_len, is_causal, return_weights, packed",
    [
        (128, True, False, False),
        (256, True, False, False),
        (256, False, False, False),
        (256, True, True, False),  # the weights are materialised anyway: dense
        (4096, True, False, False),
        (8192, True, False, False),
        (4096, False, False, False),
        (255, False, False, True),
        (256, False, False, True),
        (256, False, True, True),  # the weights are materialised anyway: dense
    ],
)
def test_auto_takes_the_fastest_kernel_no_heavier_than_keras(query_len, is_causal, return_weights, packed):
    query = key = keras.KerasTensor((2, query_len, 4, 8))
    ids = keras.KerasTensor((2, query_len), dtype="int32") if packed else None
    call = AttentionCall(
        query,
        key,
        key,
        pattern=Causal() if is_causal else None,
        return_weights=return_weights,
        query_segment_ids=ids,
        key_segment_ids=ids,
    )
    path = attention_module._choose_implementation("auto", call)
    assert path == rule_choice(cost_model.explain(call))
    if return_weights:
        assert path == "dense"


def test_mask_helpers_match_numpy():
    rows, cols = np.arange(4)[:, None], np.arange(6)[None, :]
    np.testing.assert_array_equal(causal_mask(4, 6)[0, 0], cols <= rows)
    np.testing.assert_array_equal(causal_mask(4, 6, query_offset=2)[0, 0], cols <= rows + 2)
    np.testing.assert_array_equal(sliding_window_mask(4, 6, 2)[0, 0], np.abs(rows - cols) < 2)
    np.testing.assert_array_equal(sliding_window_mask(4, 6, 2, query_offset=2)[0, 0], np.abs(rows + 2 - cols) < 2)
    query_mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
    key_mask = np.array([[1, 0, 1, 1], [0, 1, 1, 1]], bool)
    merged = padding_mask_to_attention_mask(query_mask, key_mask)
    np.testing.assert_array_equal(merged, query_mask[:, None, :, None] & key_mask[:, None, None, :])
    assert padding_mask_to_attention_mask(None, None) is None
    assert merge_masks(None, None) is None


def _bad_call(**overrides):
    rng = np.random.default_rng(0)
    query, key, value = _qkv(rng, 2, 5, 6, 4, 2, 8, 8)
    arguments = dict(query=query, key=key, value=value)
    arguments.update(overrides)
    return lambda: scaled_dot_product_attention(**arguments)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(query=np.zeros((2, 5, 32), "float32")), "query.shape=(2, 5, 32)"),
        (dict(key=np.zeros((2, 6, 16), "float32")), "key.shape=(2, 6, 16)"),
        (dict(value=np.zeros((2, 6, 2, 8, 1), "float32")), "value.shape=(2, 6, 2, 8, 1)"),
        (dict(key=np.zeros((2, 6, 2, 5), "float32")), "key.shape=(2, 6, 2, 5)"),
        (dict(value=np.zeros((2, 7, 2, 8), "float32")), "value.shape=(2, 7, 2, 8)"),
        (dict(value=np.zeros((2, 6, 1, 8), "float32")), "value.shape=(2, 6, 1, 8)"),
        (
            dict(key=np.zeros((2, 6, 3, 8), "float32"), value=np.zeros((2, 6, 3, 8), "float32")),
            "key.shape=(2, 6, 3, 8)",
        ),
        (dict(mask=np.ones((2, 5, 6), bool)), "mask.shape=(2, 5, 6)"),
        (dict(mask=np.ones((2, 1, 4, 6), bool)), "mask.shape=(2, 1, 4, 6)"),
        (dict(mask=np.ones((3, 1, 5, 6), bool)), "mask.shape=(3, 1, 5, 6)"),
        (dict(bias=np.zeros((1, 3, 5, 6), "float32")), "bias.shape=(1, 3, 5, 6)"),
        (dict(bias=np.zeros((5, 6), "float32")), "bias.shape=(5, 6)"),
        (dict(sliding_window=0), "sliding_window=0"),
        (dict(sliding_window=-2), "sliding_window=-2"),
        (dict(sliding_window=1.5), "sliding_window=1.5"),
        (dict(sliding_window=True), "sliding_window=True"),
        (dict(dropout_rate=1.0), "dropout_rate=1.0"),
        (dict(dropout_rate=-0.1), "dropout_rate=-0.1"),
        (dict(implementation="chunked", is_causal=True, return_weights=True), "return_weights=True"),
        (dict(implementation="chunked", is_causal=True, query_offset=tf.constant(1)), "query_offset=<tf.Tensor"),
        (dict(implementation="flash"), "implementation='flash'"),
        (dict(is_causal=True, query_offset=-1), "query_offset=-1"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_argument_and_value(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _bad_call(**overrides)()


def test_the_families_guide_lists_every_kernel_of_the_registry():
    guide = Path(keras_attn.__file__).parents[1] / "docs" / "guides" / "attention_families.md"
    assert kernels_table() in guide.read_text(encoding="utf-8")
