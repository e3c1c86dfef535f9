"""What padding guarantees, for every kernel of `MultiHeadAttention` and every attention family (issue #40, items 1-3).

The cases come from the registries (`keras_attn.kernels.KERNELS`, `keras_attn.attention_families.FAMILIES`), so a new
kernel or family is covered here without a new line. Oracles:

- outputs: a padded query position outputs exactly 0 (the output projection's bias included), and so does a query
  row whose keys are all masked; a real position outputs what the same layer outputs on the sequence with the padding
  cut off (within 1e-5 in float32);
- gradients: NaN or inf in the padded positions leaves every weight gradient finite and equal to the gradient with
  zeros there, for the layer alone and inside `TransformerEncoder(padding_mask=...)`;
- `query_mask` means what it means in Keras in every family: which query positions are real, not which keys are;
  keys are masked by `value_mask` / `key_mask`.

Each in float32 and mixed_float16 eagerly; the layers' outputs and gradients also under XLA (`jit_compile=True`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from keras_attn import attention_families
from keras_attn.attention_families import FAMILIES
from keras_attn.kernels import KERNELS
from keras_attn.patterns import Causal
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests.kernel_registry import kernels_taking
from tests.layer_checks import MIXED_PRECISION_TOLERANCES
from tests.test_attention_families import ARGUMENTS

HEADS, KEY_DIM, FEATURES, LENGTH = 2, 4, 6, 9
LENGTHS = (LENGTH, 5)  # real tokens of each batch element, the rest padding
REAL = np.arange(LENGTH)[None, :] < np.array(LENGTHS)[:, None]  # (batch, seq)
# A pattern every kernel takes: the strided kernel needs a strided part.
STRIDED = Causal() & (SlidingWindow(3) | Strided(3))
ATOL = {"float32": 1e-5, **MIXED_PRECISION_TOLERANCES}
POLICIES = ("float32", "mixed_float16")


def _kernel_layer(kernel, policy):
    """`MultiHeadAttention` running `kernel`, with the strided pattern where the kernel needs one."""
    pattern = None if kernel in kernels_taking() else STRIDED
    assert kernel in kernels_taking(pattern=pattern), f"{kernel} takes neither a plain call nor {STRIDED!r}"
    return keras_attn.MultiHeadAttention(
        num_heads=HEADS,
        key_dim=KEY_DIM,
        implementation=kernel,
        attention_pattern=pattern,
        bias_initializer="random_normal",
        dtype=policy,
    )


def _family_layer(name, policy):
    return attention_families.build(
        name,
        num_heads=HEADS,
        key_dim=KEY_DIM,
        bias_initializer="random_normal",
        dtype=policy,
        **ARGUMENTS.get(name, {}),
    )


LAYERS = {
    **{f"kernel-{kernel}": lambda policy, kernel=kernel: _kernel_layer(kernel, policy) for kernel in KERNELS},
    **{f"family-{name}": lambda policy, name=name: _family_layer(name, policy) for name in FAMILIES},
}
CASES = [(name, policy) for name in LAYERS for policy in POLICIES]
# Eagerly in both policies; XLA compiles are slow, so in float32 only (the cast paths are the eager ones').
RUNS = [(name, policy, False) for name, policy in CASES] + [(name, "float32", True) for name in LAYERS]
RUN_IDS = [f"{name}-{policy}-{'xla' if jit else 'eager'}" for name, policy, jit in RUNS]


def _inputs(poison=0.0, seed=0):
    """`(batch, seq, features)` float32 inputs holding `poison` at the padded positions."""
    x = np.random.default_rng(seed).standard_normal((len(LENGTHS), LENGTH, FEATURES)).astype("float32")
    return np.where(REAL[..., None], x, np.float32(poison)).astype("float32")


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32")), np.float64)


def _padded_call(layer, x, jit=False):
    """The layer on `x` with both padding masks (self-attention); under XLA with `jit`."""

    def call(inputs):
        return layer(inputs, query_mask=REAL, value_mask=REAL)

    return _numpy(tf.function(call, jit_compile=True)(x) if jit else call(x))


def _unpadded_rows(layer, x):
    """Each batch element's real rows, computed on its sequence with the padding cut off."""
    return [_numpy(layer(x[b : b + 1, :length]))[0] for b, length in enumerate(LENGTHS)]


@pytest.mark.parametrize("name,policy,jit", RUNS, ids=RUN_IDS)
def test_padded_rows_output_zero_and_real_rows_match_the_unpadded_sequence(name, policy, jit):
    layer = LAYERS[name](policy)
    x = _inputs()
    layer(x)  # built, so the bias can be set non-zero before the padded call
    output_bias = layer._output_dense.bias if hasattr(layer, "_output_dense") else layer.output_dense.bias
    output_bias.assign(keras.ops.ones_like(output_bias))  # a padded row equal to the bias is then 1, not 0
    output = _padded_call(layer, x, jit)
    assert np.all(output[~REAL] == 0), f"padded rows: {output[~REAL]}"
    for b, expected in enumerate(_unpadded_rows(layer, x)):
        np.testing.assert_allclose(output[b, : LENGTHS[b]], expected, atol=ATOL[policy], err_msg=f"batch {b}")


@pytest.mark.parametrize("name", LAYERS)
def test_a_query_row_without_any_key_outputs_zero(name):
    """All keys of batch element 1 masked (`value_mask`): each of its rows has no key, and outputs 0."""
    layer = LAYERS[name]("float32")
    keys = np.array([[True] * LENGTH, [False] * LENGTH])
    output = _numpy(layer(_inputs(), value_mask=keys))
    assert np.all(output[1] == 0), output[1]
    assert np.any(output[0] != 0)


def test_a_row_masked_by_attention_mask_outputs_zero():
    layer = keras_attn.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, bias_initializer="ones")
    attention_mask = np.ones((2, LENGTH, LENGTH), bool)
    attention_mask[0, 3] = False  # query 3 of batch element 0 sees no key
    output = _numpy(layer(_inputs(), attention_mask=attention_mask))
    assert np.all(output[0, 3] == 0)
    assert np.all(output[0, :3] != 0) and np.all(output[1] != 0)


def _tape_gradients(layer, x, call, cotangent):
    """Gradients of `sum(call(layer, x) * cotangent)` for every trainable weight."""
    with tf.GradientTape() as tape:
        output = keras.ops.cast(call(layer, x), "float32")
        loss = keras.ops.sum(output * cotangent)
    return tape.gradient(loss, layer.trainable_weights)


def _weight_gradients(layer, x, call, cotangent):
    return [_numpy(gradient) for gradient in _tape_gradients(layer, x, call, cotangent)]


def _check_gradients_ignore_padding(layer, call, policy, jit):
    clean = _inputs(0.0)
    layer(clean)  # built
    cotangent = np.random.default_rng(1).standard_normal((len(LENGTHS), LENGTH, FEATURES)).astype("float32")

    def gradients(x):
        return _weight_gradients(layer, x, call, cotangent)

    if jit:
        compiled = tf.function(lambda x: _tape_gradients(layer, x, call, cotangent), jit_compile=True)

        def gradients(x):
            return [_numpy(gradient) for gradient in compiled(x)]

    expected = gradients(clean)
    names = [weight.path for weight in layer.trainable_weights]
    for poison in (np.nan, np.inf, -np.inf):
        received = gradients(_inputs(poison))
        broken = [name for name, gradient in zip(names, received) if not np.all(np.isfinite(gradient))]
        assert not broken, f"poison {poison}: non-finite gradients of {broken}"
        for name, got, want in zip(names, received, expected):
            np.testing.assert_allclose(got, want, atol=ATOL[policy], err_msg=f"poison {poison}: {name}")


@pytest.mark.parametrize("name,policy,jit", RUNS, ids=RUN_IDS)
def test_nonfinite_padding_never_reaches_the_weight_gradients(name, policy, jit):
    def call(layer, x):
        return layer(x, query_mask=REAL, value_mask=REAL)

    _check_gradients_ignore_padding(LAYERS[name](policy), call, policy, jit)


@pytest.mark.parametrize("name,policy", CASES)
def test_nonfinite_padding_never_reaches_the_encoder_gradients(name, policy):
    encoder = keras_attn.TransformerEncoder(
        intermediate_dim=8, num_heads=HEADS, self_attention=LAYERS[name](policy), dtype=policy
    )

    def call(layer, x):
        return layer(x, padding_mask=REAL)

    _check_gradients_ignore_padding(encoder, call, policy, jit=False)


@pytest.mark.parametrize("name", LAYERS)
def test_query_mask_alone_marks_real_queries_not_keys(name):
    """Keras's meaning in every family: a bare `query_mask` zeroes the padded query rows and leaves
    every key attended (the real rows are those of the unmasked call); a bare `value_mask` masks
    the keys (the real rows are those of the unpadded sequence)."""
    layer = LAYERS[name]("float32")
    x = _inputs(seed=2)
    unmasked = _numpy(layer(x))
    queries_masked = _numpy(layer(x, query_mask=REAL))
    assert np.all(queries_masked[~REAL] == 0)
    np.testing.assert_allclose(queries_masked[REAL], unmasked[REAL], atol=1e-5)
    keys_masked = _numpy(layer(x, value_mask=REAL))
    for b, expected in enumerate(_unpadded_rows(layer, x)):
        np.testing.assert_allclose(keys_masked[b, : LENGTHS[b]], expected, atol=1e-5, err_msg=f"batch {b}")
