"""Logit soft-capping (`logit_soft_cap`: `tanh(scale * Q K^T / cap) * cap` before the bias and the mask,
Gemma 2's) on every kernel of the registry, forward and backward, against the float64 reference."""

import re

import numpy as np
import pytest
import tensorflow as tf

from keras_attn import patterns
from keras_attn import scaled_dot_product_attention
from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall
from keras_attn.ops import dot_product_attention
from keras_attn.validation import FLOAT32_MAX
from keras_attn.validation import FLOAT32_SMALLEST_NORMAL
from tests import reference
from tests.kernel_registry import kernels_taking

LENGTH, HEADS, DEPTH = 16, 2, 4
SOFT_CAP = 1.5
SCALE = 2.0  # above 1: the streaming kernels would otherwise scale shifted logits, not fold the scale
# Per kernel, the first of these patterns it takes: causal, or causal and strided for the strided kernel.
CANDIDATE_PATTERNS = (patterns.Causal(), patterns.Causal() & (patterns.SlidingWindow(4) | patterns.Strided(4)))


def _pattern_for(kernel_name):
    tensor = tf.zeros((2, LENGTH, HEADS, DEPTH))
    for pattern in CANDIDATE_PATTERNS:
        call = AttentionCall(query=tensor, key=tensor, value=tensor, pattern=pattern, logit_soft_cap=SOFT_CAP)
        if KERNELS[kernel_name].why_unsupported(call) is None:
            return pattern
    pytest.fail(f"kernel {kernel_name!r} takes none of the candidate patterns")


def _inputs(seed):
    rng = np.random.default_rng(seed)
    query, key, value = (rng.normal(size=(2, LENGTH, HEADS, DEPTH)) for _ in range(3))
    padding = np.ones((2, LENGTH), bool)
    padding[1, 11:] = False  # the second row is padded
    mask = padding[:, None, None, :] & padding[:, None, :, None]  # padded queries: rows without keys
    mask = np.broadcast_to(mask, (2, HEADS, LENGTH, LENGTH)).copy()
    mask[0, 1, 6] = False  # a fully masked row inside the real tokens
    bias = rng.normal(size=(1, HEADS, LENGTH, LENGTH))
    return query, key, value, mask, bias


def _attend(kernel_name, tensors, mask, pattern):
    query, key, value, bias = tensors
    return scaled_dot_product_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        pattern=pattern,
        scale=SCALE,
        logit_soft_cap=SOFT_CAP,
        implementation=kernel_name,
    )


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
def test_soft_capped_outputs_and_gradients_match_the_float64_reference(kernel_name):
    query, key, value, mask, bias = _inputs(seed=len(kernel_name))
    with_bias = kernel_name in kernels_taking(with_bias=True)
    bias = bias if with_bias else None
    pattern = _pattern_for(kernel_name)
    allowed = mask & np.asarray(pattern.block_mask(LENGTH, LENGTH, 0))
    output_gradient = np.random.default_rng(7).normal(size=(2, LENGTH, HEADS, DEPTH))
    tensors = [tf.constant(t) for t in (query, key, value) + (() if bias is None else (bias,))]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        output = _attend(kernel_name, tensors + ([None] if bias is None else []), mask, pattern)
        loss = tf.reduce_sum(output * output_gradient)
    grads = tape.gradient(loss, tensors)

    want, _ = reference.attention(query, key, value, mask=allowed, bias=bias, scale=SCALE, soft_cap=SOFT_CAP)
    np.testing.assert_allclose(np.asarray(output), want, atol=1e-10)
    uncapped, _ = reference.attention(query, key, value, mask=allowed, bias=bias, scale=SCALE)
    assert np.abs(want - uncapped).max() > 0.05  # the cap changes the result: the test sees it
    assert np.all(np.asarray(output)[0, 6, 1] == 0) and np.all(np.asarray(output)[1, 11:] == 0)  # rows without keys
    d_query, d_key, d_value, d_logits = reference.attention_gradients(
        query, key, value, output_gradient, mask=allowed, bias=bias, scale=SCALE, soft_cap=SOFT_CAP
    )
    wanted = [d_query, d_key, d_value] + ([] if bias is None else [d_logits.sum(axis=0, keepdims=True)])
    for name, got, expected in zip(("query", "key", "value", "bias"), grads, wanted):
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("soft_cap", [0, -1.0, float("inf"), float("nan"), "50", True])
def test_a_bad_soft_cap_is_refused_naming_it(soft_cap):
    tensor = tf.zeros((1, 4, 1, 2))
    with pytest.raises(ValueError, match=r"`logit_soft_cap` must be .*Received: logit_soft_cap="):
        scaled_dot_product_attention(tensor, tensor, tensor, logit_soft_cap=soft_cap)


def test_the_keras_signature_op_takes_attn_logits_soft_cap():
    query, key, value, _, bias = _inputs(seed=3)
    got = dot_product_attention(query, key, value, bias=bias, scale=SCALE, attn_logits_soft_cap=SOFT_CAP)
    want, _ = reference.attention(query, key, value, bias=bias, scale=SCALE, soft_cap=SOFT_CAP)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-10)


# The ends of the accepted range (`check_soft_cap`: the normal float32 numbers) and a cap past which
# `logits / cap` of ordinary logits is below the smallest normal float32 (flushed to 0 on CPUs).
RANGE_ENDS = (FLOAT32_SMALLEST_NORMAL, 1e37, FLOAT32_MAX)


@pytest.mark.parametrize("kernel_name", sorted(KERNELS))
@pytest.mark.parametrize("soft_cap", RANGE_ENDS)
def test_s1_s2_float32_logits_are_capped_exactly_at_the_ends_of_the_range(kernel_name, soft_cap):
    """Issue 51, S1 and S2: float32 logits from 0 (a zero query: an uncapped row at any cap) to
    about 40, at the smallest and the largest caps accepted, forward and gradients, against the float64
    reference (a large cap once flushed `x / cap` to 0, a small one gave a gradient of 0 or NaN)."""
    query, key, value, _, _ = (t.astype("float32") for t in _inputs(seed=11))
    query[0, 0] = 0.0  # logits exactly 0: the cap's derivative is 1 there, whatever the cap
    pattern = _pattern_for(kernel_name)
    allowed = np.asarray(pattern.block_mask(LENGTH, LENGTH, 0))
    output_gradient = np.random.default_rng(5).normal(size=query.shape).astype("float32")
    tensors = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        output = scaled_dot_product_attention(
            *tensors, pattern=pattern, scale=SCALE, logit_soft_cap=soft_cap, implementation=kernel_name
        )
        loss = tf.reduce_sum(output * output_gradient)
    grads = tape.gradient(loss, tensors)

    want, _ = reference.attention(query, key, value, mask=allowed, scale=SCALE, soft_cap=soft_cap)
    np.testing.assert_allclose(np.asarray(output), want, atol=2e-6)
    wanted = reference.attention_gradients(
        query, key, value, output_gradient, mask=allowed, scale=SCALE, soft_cap=soft_cap
    )
    for name, got, expected in zip(("query", "key", "value"), grads, wanted[:3]):
        np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5, err_msg=name)


@pytest.mark.parametrize(
    "soft_cap", [1e-40, float(np.nextafter(np.float32(FLOAT32_SMALLEST_NORMAL), np.float32(0))), 3.5e38]
)
def test_s2_a_cap_outside_the_normal_float32_numbers_is_refused_naming_it(soft_cap):
    """Issue 51, S2: a subnormal cap (read as 0 where subnormals are flushed: a NaN gradient) or one
    past the float32 limit is refused on every surface, naming the argument and the value."""
    tensor = tf.zeros((1, 4, 1, 2))
    with pytest.raises(
        ValueError, match=rf"`logit_soft_cap` must be .*Received: logit_soft_cap={re.escape(repr(soft_cap))}"
    ):
        scaled_dot_product_attention(tensor, tensor, tensor, logit_soft_cap=soft_cap)
    with pytest.raises(
        ValueError, match=rf"`attn_logits_soft_cap` .*Received: attn_logits_soft_cap={re.escape(repr(soft_cap))}"
    ):
        dot_product_attention(tensor, tensor, tensor, attn_logits_soft_cap=soft_cap)


@pytest.mark.parametrize("implementation", [*KERNELS, "auto"])
@pytest.mark.parametrize("cap", [0.1, 5.0])
def test_float64_capped_attention_is_exact_to_float64(cap, implementation):
    rng = np.random.default_rng(11)
    query, key, value = (rng.standard_normal((2, 3, 2, 3)) for _ in range(3))
    pattern = patterns.Causal() & (patterns.SlidingWindow(2) | patterns.Strided(2))  # one every kernel takes
    allowed = np.asarray(pattern.mask(np.arange(3), np.arange(3)))
    cases = [
        (
            scaled_dot_product_attention(
                query, key, value, logit_soft_cap=cap, pattern=pattern, implementation=implementation
            ),
            reference.attention(query, key, value, mask=allowed, soft_cap=cap)[0],
        )
    ]
    if implementation == "auto":  # the Keras signature
        cases.append(
            (
                dot_product_attention(query, key, value, attn_logits_soft_cap=cap, is_causal=True),
                reference.attention(query, key, value, is_causal=True, soft_cap=cap)[0],
            )
        )
    for output, expected in cases:  # the scale and the cap enter as float64, not rounded through float32 on the way
        np.testing.assert_allclose(output, expected, rtol=0, atol=1e-13)
