"""Masking and precision at every logit scale, on every kernel, against the float64 reference.

A masked key must never win because the allowed logits are very negative (a finite fill such as
`-1e9` did); the inverse temperature beta may go up to the float32 limit on the dense kernel; and
under float16 inputs the logits are float32, so products beyond float16's 65,504 stay finite.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import MultiHeadAttention
from keras_attn import patterns
from keras_attn import scaled_dot_product_attention
from keras_attn.attention import KERNELS
from keras_attn.attention_call import AttentionCall
from tests import reference

LENGTH = 16
# Per kernel, the first of these patterns it takes (every kernel takes one: checked below).
CANDIDATE_PATTERNS = (None, patterns.Strided(4), patterns.SlidingWindow(LENGTH))
BETAS_EVERY_KERNEL = (1e-30, 1e-3, 1.0, 1e8)
# The dense kernel multiplies beta into logits already shifted by their row maximum: any beta.
BETAS_DENSE = (1e30, 1e38, float(np.finfo("float32").max))


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


def _huge_logit_inputs(seed, batch=2, heads=2):
    """Depth-1 query/key whose products `q.k` span 1e-30 .. 1e30 in size, both signs; in the second
    batch row the keys are all above 1e10, so a query of -1 has every logit below -1e10."""
    rng = np.random.default_rng(seed)
    query = rng.choice([-1.0, 1.0], size=(batch, LENGTH, heads, 1))
    magnitude = 10.0 ** rng.uniform(-30, 30, size=(batch, LENGTH, heads, 1))
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


@pytest.mark.parametrize("beta", BETAS_DENSE)
def test_dense_kernel_takes_beta_up_to_the_float32_limit_with_finite_gradients(beta):
    query, key, value, mask = _huge_logit_inputs(seed=7)
    query, key = query * 1e-8, key * 1e-8  # logits up to 1e14, so beta * logit overflows float32
    inputs = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output, weights = scaled_dot_product_attention(
            *inputs, mask=mask, scale=beta, implementation="dense", return_weights=True
        )
        loss = tf.reduce_sum(output)
    want_output, want_weights = reference.attention(query, key, value, mask=mask, scale=beta)
    np.testing.assert_allclose(np.asarray(weights), want_weights, atol=1e-6)
    np.testing.assert_allclose(np.asarray(output), want_output, atol=2e-5)
    for gradient in tape.gradient(loss, inputs):
        assert np.all(np.isfinite(gradient)), "a NaN or inf gradient"


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
        dtype: np.asarray(scaled_dot_product_attention(
            *(t.astype(dtype) for t in (query, key, value)), pattern=pattern, implementation=kernel_name,
        ), "float32")
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
