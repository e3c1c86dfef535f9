"""Masking and precision at every logit scale, on every kernel, against the float64 reference.

A masked key must never win because the allowed logits are very negative (a finite fill such as
`-1e9` did); the inverse temperature beta may go up to the float32 limit on every kernel (each
shifts the logits by their row maximum before scaling); and under float16 inputs the logits are
float32, so products beyond float16's 65,504 stay finite.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import MultiHeadAttention
from keras_attn import patterns
from keras_attn import scaled_dot_product_attention
from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall
from tests import reference

LENGTH = 16
# Per kernel, the first of these patterns it takes (every kernel takes one: checked below).
CANDIDATE_PATTERNS = (None, patterns.Strided(4), patterns.SlidingWindow(LENGTH))
BETAS_EVERY_KERNEL = (1e-30, 1e-3, 1.0, 1e8)
# Every kernel multiplies beta into logits already shifted by their row maximum: any beta.
BETAS_UP_TO_THE_LIMIT = (1e30, 1e38, float(np.finfo("float32").max))


def _pattern_for(kernel_name, query, key, value):
    for pattern in CANDIDATE_PATTERNS:
        call = AttentionCall(query=query, key=key, value=value, mask=None, bias=None, pattern=pattern)
        if KERNELS[kernel_name].why_unsupported(call) is None:
            return pattern
    pytest.fail(f"kernel {kernel_name!r} takes none of the candidate patterns")


def _pattern_mask(pattern, length):
    if pattern is None:
        return np.ones((1, 1, length, length), bool)
    return np.asarray(pattern.block_mask(length, length, 0))


def _huge_logit_inputs(seed, batch=2, heads=2, smallest=-30):
    """Depth-1 query/key whose products `q.k` span `10**smallest` .. 1e30 in size, both signs; in the
    second batch row the keys are all above 1e10, so a query of -1 has every logit below -1e10."""
    rng = np.random.default_rng(seed)
    query = rng.choice([-1.0, 1.0], size=(batch, LENGTH, heads, 1))
    magnitude = 10.0 ** rng.uniform(smallest, 30, size=(batch, LENGTH, heads, 1))
    key = magnitude * rng.choice([-1.0, 1.0], size=magnitude.shape)
    key[1] = 10.0 ** rng.uniform(10, 30, size=key[1].shape)
    value = rng.normal(size=(batch, LENGTH, heads, 3))
    mask = rng.random((batch, 1, LENGTH, LENGTH)) < 0.6
    mask[:, :, 3] = False  # a fully masked row: zero weights and output
    mask[0, :, 5] = [True] + [False] * (LENGTH - 1)  # a row with one allowed key
    return [t.astype("float32") for t in (query, key, value)] + [mask]


def test_the_issue_reproduction_gives_the_allowed_key_all_the_weight():
    query = np.full((1, 1, 1, 1), -1e5, "float32")
    key = np.full((1, 3, 1, 1), 1e5, "float32")
    key[0, 1] = 2e5
    value = np.arange(3, dtype="float32").reshape(1, 3, 1, 1)
    mask = np.array([True, True, False])[None, None, None]
    output, weights = scaled_dot_product_attention(query, key, value, mask=mask, scale=1.0, return_weights=True)
    np.testing.assert_array_equal(np.asarray(weights).ravel(), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(output).ravel(), [0.0])


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
@pytest.mark.parametrize("beta", BETAS_EVERY_KERNEL)
def test_every_kernel_is_exact_for_logits_up_to_1e30(kernel_name, beta):
    query, key, value, mask = _huge_logit_inputs(seed=int(np.log10(beta) + 40))
    pattern = _pattern_for(kernel_name, query, key, value)
    allowed = mask & _pattern_mask(pattern, LENGTH)
    output = scaled_dot_product_attention(
        query, key, value, mask=mask, pattern=pattern, scale=beta, implementation=kernel_name
    )
    want, _ = reference.attention(query, key, value, mask=allowed, scale=beta)
    np.testing.assert_allclose(np.asarray(output), want, atol=2e-5)


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
@pytest.mark.parametrize("beta", BETAS_UP_TO_THE_LIMIT)
@pytest.mark.parametrize("largest_logit", [1e14, 1e30])
def test_every_kernel_takes_beta_up_to_the_float32_limit(kernel_name, beta, largest_logit):
    # Logits from 1e-14 (1e-30 for the smaller set) up to `largest_logit` in size, so beta * logit
    # overflows float32; none below float32's smallest normal number (1.2e-38), which the CPU's
    # matmul flushes to 0 on every path.
    query, key, value, mask = _huge_logit_inputs(seed=7, smallest=-14)
    factor = np.sqrt(largest_logit / 1e30)
    query, key = query * factor, key * factor
    pattern = _pattern_for(kernel_name, query, key, value)
    output = scaled_dot_product_attention(
        query, key, value, mask=mask, pattern=pattern, scale=beta, implementation=kernel_name
    )
    want, _ = reference.attention(query, key, value, mask=mask & _pattern_mask(pattern, LENGTH), scale=beta)
    np.testing.assert_allclose(np.asarray(output), want, atol=2e-5)


def test_the_dense_kernel_has_finite_gradients_for_beta_up_to_the_float32_limit():
    """Rows saturated to one-hot weights have a zero logits gradient: exactly, on the dense kernel.

    Every allowed row here saturates, so the float64 query and key gradients are exactly 0 at each
    beta, also where the CPU's softmax rounds a one-hot 1 down by one float32 step. (The streaming
    kernels subtract FlashAttention's `rowsum(dO * O)`, whose float32 rounding against `dO V^T` is
    multiplied by beta there; the quickstart guide's limits say so.)
    """
    query, key, value, mask = _huge_logit_inputs(seed=7)
    query, key = query * 1e-8, key * 1e-8
    inputs = [tf.constant(t) for t in (query, key, value)]
    for beta in BETAS_UP_TO_THE_LIMIT:
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            output = scaled_dot_product_attention(*inputs, mask=mask, scale=beta, implementation="dense")
            loss = tf.reduce_sum(output)
        wants = reference.attention_gradients(query, key, value, np.ones_like(value), mask=mask, scale=beta)[:3]
        for name, got, want in zip(("query", "key", "value"), tape.gradient(loss, inputs), wants):
            np.testing.assert_allclose(
                np.asarray(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{name} at beta={beta}"
            )


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
@pytest.mark.parametrize("beta", (1e-30, 1.0, 1e30))
def test_every_kernel_gives_the_gradients_of_beta_times_the_logits_at_any_beta(kernel_name, beta):
    """Logits `beta * q.k` of order 10 from `q.k` of order `10 / beta`: any misplaced beta overflows or
    vanishes. (Not at beta = 3.4e38: `q.k` of order 1e-38 are subnormal, and the CPU flushes them to 0.)"""
    rng = np.random.default_rng(9)
    size = 1e10 if beta < 1 else 1e-10  # depth 1: `q` of this size, `k` of `10 / (beta * size)`, both normal floats
    query = (rng.normal(size=(2, LENGTH, 2, 1)) * size).astype("float32")
    key = (rng.normal(size=(2, LENGTH, 2, 1)) * (10.0 / beta / size)).astype("float32")
    value, output_gradient = (rng.normal(size=(2, LENGTH, 2, 3)).astype("float32") for _ in range(2))
    mask = rng.random((2, 1, LENGTH, LENGTH)) < 0.7
    pattern = _pattern_for(kernel_name, query, key, value)
    inputs = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output = scaled_dot_product_attention(
            *inputs, mask=mask, pattern=pattern, scale=beta, implementation=kernel_name
        )
        loss = tf.reduce_sum(output * output_gradient)
    allowed = mask & _pattern_mask(pattern, LENGTH)
    want_gradients = reference.attention_gradients(query, key, value, output_gradient, mask=allowed, scale=beta)
    for name, got, want in zip(("query", "key", "value"), tape.gradient(loss, inputs), want_gradients):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-3, atol=2e-4 * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
def test_every_kernel_gives_a_tensor_beta_its_gradient(kernel_name):
    rng = np.random.default_rng(5)
    query, key, value, output_gradient = (rng.normal(size=(2, LENGTH, 2, 4)).astype("float32") for _ in range(4))
    pattern = _pattern_for(kernel_name, query, key, value)
    beta = tf.Variable(0.7)
    with tf.GradientTape() as tape:
        output = scaled_dot_product_attention(
            query, key, value, pattern=pattern, scale=beta, implementation=kernel_name
        )
        loss = tf.reduce_sum(output * output_gradient)
    allowed = _pattern_mask(pattern, LENGTH)
    d_logits = reference.attention_gradients(query, key, value, output_gradient, mask=allowed, scale=0.7)[3]
    raw_logits = np.einsum("bqhd,bkhd->bhqk", query.astype("float64"), key.astype("float64"))
    np.testing.assert_allclose(float(tape.gradient(loss, beta)), np.sum(d_logits * raw_logits), rtol=1e-4)


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
def test_every_kernel_shifts_then_scales_beta_above_1_with_a_bias(kernel_name):
    """beta > 1 takes the kernels' shift-then-scale path (beta <= 1 is folded into the query); with a
    bias the streaming kernels also track the running maximum of the biased logits."""
    rng = np.random.default_rng(12)
    query, key, value, output_gradient = (rng.normal(size=(2, LENGTH, 2, 4)).astype("float32") for _ in range(4))
    bias = (rng.normal(size=(1, 2, LENGTH, LENGTH)) * 30).astype("float32")  # logits of both signs, far apart
    mask = rng.random((2, 1, LENGTH, LENGTH)) < 0.7
    pattern = _pattern_for(kernel_name, query, key, value)
    call = AttentionCall(query=query, key=key, value=value, mask=None, bias=bias, pattern=pattern)
    if KERNELS[kernel_name].why_unsupported(call) is not None:
        bias = None  # the strided kernel takes no bias
    inputs = [tf.constant(t) for t in (query, key, value)] + ([] if bias is None else [tf.constant(bias)])
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output = scaled_dot_product_attention(
            *inputs[:3],
            mask=mask,
            bias=None if bias is None else inputs[3],
            pattern=pattern,
            scale=3.0,
            implementation=kernel_name,
        )
        loss = tf.reduce_sum(output * output_gradient)
    allowed = mask & _pattern_mask(pattern, LENGTH)
    want_output, _ = reference.attention(query, key, value, mask=allowed, bias=bias, scale=3.0)
    np.testing.assert_allclose(np.asarray(output), want_output, atol=1e-5)
    want_d_query, want_d_key, want_d_value, want_d_logits = reference.attention_gradients(
        query, key, value, output_gradient, mask=allowed, bias=bias, scale=3.0
    )
    wants = [want_d_query, want_d_key, want_d_value] + (
        [] if bias is None else [want_d_logits.sum(axis=0, keepdims=True)]
    )
    for got, want in zip(tape.gradient(loss, inputs), wants):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


def _overflowing_float16_inputs(seed):
    """Query and key x300: their products (about 3.6e5) overflow float16's 65,504."""
    rng = np.random.default_rng(seed)
    query, key = (rng.normal(size=(2, LENGTH, 2, 16)) * 300 for _ in range(2))
    value = rng.normal(size=(2, LENGTH, 2, 16))
    return query, key, value


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
def test_float16_inputs_get_float32_logits_on_every_kernel(kernel_name):
    query, key, value = _overflowing_float16_inputs(seed=11)
    pattern = _pattern_for(kernel_name, *(t.astype("float16") for t in (query, key, value)))
    outputs = {
        dtype: np.asarray(
            scaled_dot_product_attention(
                *(t.astype(dtype) for t in (query, key, value)),
                pattern=pattern,
                implementation=kernel_name,
            ),
            "float32",
        )
        for dtype in ("float16", "float32")
    }
    assert np.all(np.isfinite(outputs["float16"]))
    np.testing.assert_allclose(outputs["float16"], outputs["float32"], atol=2e-2)


def test_multi_head_attention_under_mixed_float16_stays_finite_and_matches_float32():
    rng = np.random.default_rng(3)
    inputs = (rng.normal(size=(2, LENGTH, 32)) * 300).astype("float32")
    reference_layer = MultiHeadAttention(num_heads=2, key_dim=16)
    want = np.asarray(reference_layer(inputs, inputs, use_causal_mask=True))
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        layer = MultiHeadAttention(num_heads=2, key_dim=16)
        layer.build(inputs.shape, inputs.shape)
        layer.set_weights(reference_layer.get_weights())
        got = np.asarray(layer(inputs, inputs, use_causal_mask=True), "float32")
    finally:
        keras.config.set_dtype_policy(policy)
    assert np.all(np.isfinite(got))
    # float16 projections of inputs near 1e3 carry about 1e-3 relative error.
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
