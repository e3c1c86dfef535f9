"""`keras_attn.ops.dot_product_attention` and `keras_attn.enable()`: Keras's flash switch on TensorFlow.

The op against the NumPy float64 reference and against Keras's own non-flash
`dot_product_attention` (values and gradients, masks, causal, bias, grouped heads); the switch
against the pinned Keras: after `enable()` Keras's op, its `flash_attention=True` and Keras's
`MultiHeadAttention` reach our op (a spy on the one function the switch calls), `disable()`
gives Keras's behaviour back. Lengths span several blocks of the streaming kernel (128 at least).
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from keras_attn.ops import keras_flash
from keras_attn.ops.nn import dot_product_attention
from tests import reference
from tests.keras_versions import KERAS_VERSION
from tests.keras_versions import skip_before_keras
from tests.layer_checks import output_gradients

FLOAT32_ATOL = 2e-5
BATCH, QUERY_LEN, KEY_LEN, DEPTH = 2, 150, 290, 8


@pytest.fixture(autouse=True)
def keras_switch_restored():
    """Every test starts and ends with Keras's own function and its default flash setting."""
    keras_attn.disable()
    keras.config.enable_flash_attention()
    yield
    keras_attn.disable()
    keras.config.enable_flash_attention()


@pytest.fixture
def calls_to_our_op(monkeypatch):
    """The calls the switch makes to `keras_attn.ops.dot_product_attention` (a spy that delegates)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(keras_flash, "dot_product_attention", spy)
    return calls


def _inputs(rng, heads=4, kv_heads=4, query_len=QUERY_LEN, key_len=KEY_LEN):
    return (
        rng.normal(size=(BATCH, query_len, heads, DEPTH)).astype("float32"),
        rng.normal(size=(BATCH, key_len, kv_heads, DEPTH)).astype("float32"),
        rng.normal(size=(BATCH, key_len, kv_heads, DEPTH)).astype("float32"),
    )


def _padding_mask(rng):
    """Keys padded from a different length in each sequence: no query row loses every key."""
    mask = np.ones((BATCH, 1, 1, KEY_LEN), bool)
    mask[1, ..., 200:] = False
    return mask


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "padding mask": dict(mask="padding"),
    "bias of rank 2": dict(bias=(QUERY_LEN, KEY_LEN)),
    "grouped heads": dict(kv_heads=2),
    "multi-query": dict(kv_heads=1),
    "everything": dict(kv_heads=2, is_causal=True, mask="padding", bias=(1, 4, QUERY_LEN, KEY_LEN), scale=0.2),
}


def _case(name, seed=0):
    """`(query, key, value, keyword arguments)` of one case."""
    options = dict(CASES[name])
    rng = np.random.default_rng(seed)
    query, key, value = _inputs(rng, kv_heads=options.pop("kv_heads", 4))
    if options.get("mask") == "padding":
        options["mask"] = _padding_mask(rng)
    if "bias" in options:
        options["bias"] = rng.normal(size=options["bias"]).astype("float32")
    return query, key, value, options


def _reference(query, key, value, mask=None, bias=None, **options):
    bias = None if bias is None else np.broadcast_to(bias, (BATCH, query.shape[2], query.shape[1], key.shape[1]))
    return reference.attention(query, key, value, mask=mask, bias=bias, **options)[0]


def _keras_non_flash(query, key, value, **options):
    # Keras's TensorFlow path repeats grouped heads only from 2 kv heads and from Keras 3.15 on (its einsum fails)
    if key.shape[2] < query.shape[2] and (key.shape[2] == 1 or KERAS_VERSION < (3, 15)):
        key, value = (keras.ops.repeat(t, query.shape[2] // key.shape[2], axis=2) for t in (key, value))
    return keras.ops.dot_product_attention(query, key, value, flash_attention=False, **options)


@pytest.mark.parametrize("name", CASES)
def test_flash_output_matches_numpy_and_keras_non_flash(name):
    query, key, value, options = _case(name)
    ours = np.asarray(dot_product_attention(query, key, value, flash_attention=True, **options))
    np.testing.assert_allclose(ours, _reference(query, key, value, **options), atol=FLOAT32_ATOL)
    np.testing.assert_allclose(ours, np.asarray(_keras_non_flash(query, key, value, **options)), atol=FLOAT32_ATOL)


@pytest.mark.parametrize("name", ["causal", "grouped heads", "everything"])
def test_flash_gradients_match_keras_non_flash(name):
    query, key, value, options = _case(name, seed=1)
    bias = options.pop("bias", np.zeros((1, 1, QUERY_LEN, KEY_LEN), "float32"))
    output_grad = np.random.default_rng(2).normal(size=query.shape).astype("float32")

    def ours(q, k, v, b):
        return dot_product_attention(q, k, v, bias=b, flash_attention=True, **options)

    def keras_own(q, k, v, b):
        return _keras_non_flash(q, k, v, bias=b, **options)

    expected = output_gradients(keras_own, [query, key, value, bias], output_grad)
    for got, want in zip(output_gradients(ours, [query, key, value, bias], output_grad), expected):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_flash_gradients_match_numpy():
    query, key, value, options = _case("causal", seed=3)
    mask = _padding_mask(np.random.default_rng(3))
    output_grad = np.random.default_rng(4).normal(size=query.shape).astype("float32")
    got = output_gradients(
        lambda q, k, v: dot_product_attention(q, k, v, mask=mask, is_causal=True, flash_attention=True),
        [query, key, value],
        output_grad,
    )
    want = reference.attention_gradients(query, key, value, output_grad, mask=mask, is_causal=True)[:3]
    for got_one, want_one in zip(got, want):
        np.testing.assert_allclose(got_one, want_one, atol=1e-4)


@pytest.mark.parametrize("flash_attention", [None, False])
def test_other_settings_compute_the_same_attention(flash_attention):
    query, key, value, options = _case("everything", seed=5)
    got = dot_product_attention(query, key, value, flash_attention=flash_attention, **options)
    np.testing.assert_allclose(np.asarray(got), _reference(query, key, value, **options), atol=FLOAT32_ATOL)


def test_output_dtype_is_the_promoted_input_dtype_as_in_keras():
    skip_before_keras((3, 12), "the promotion of mixed input dtypes in TensorFlow's dot_product_attention")
    query, key, value, _ = _case("plain")
    got = dot_product_attention(query.astype("float16"), key, value, flash_attention=True)
    want = _keras_non_flash(query.astype("float16"), key, value)
    assert keras.backend.standardize_dtype(got.dtype) == keras.backend.standardize_dtype(want.dtype) == "float32"


def _rows_removed(rng, batch, heads, query_len, key_len):
    """A random mask that removes whole query rows: some rows with every key masked."""
    mask = rng.random((batch, heads, query_len, key_len)) < 0.5
    mask[0, :, 7] = False  # every head
    mask[1, 1, 3] = False  # one head
    mask[1, :, -2:] = False  # the last queries
    return mask


ROWS_REMOVED = {
    "mask": dict(),
    "causal": dict(is_causal=True),
    "bias": dict(bias=True),
    "grouped heads, causal, bias": dict(kv_heads=2, is_causal=True, bias=True),
    "padded queries as ESM masks them": dict(query_mask=True),
    "left-padded keys, causal: the first queries see no key": dict(left_padding=True, is_causal=True),
}


@pytest.mark.parametrize("name", ROWS_REMOVED)
@pytest.mark.parametrize("flash_attention", [True, None])
def test_enabled_op_equals_keras_own_where_whole_query_rows_are_masked(name, flash_attention, calls_to_our_op):
    # Keras gives a query without keys the mean of the values (uniform softmax over its equal masked
    # logits); under `enable()` Keras's op must give the same values and gradients on our kernel.
    options = dict(ROWS_REMOVED[name])
    if "kv_heads" in options:
        skip_before_keras((3, 15), "grouped-query heads in keras.ops.dot_product_attention on TensorFlow (the oracle)")
    rng = np.random.default_rng(len(name))
    batch, heads, query_len, key_len = 2, 4, 140, 150
    query, key, value = (t.astype("float64") for t in _inputs(rng, heads, options.pop("kv_heads", heads), 140, 150))
    if options.pop("query_mask", False):
        options["mask"] = np.ones((batch, 1, query_len, 1), bool)
        options["mask"][1, :, 100:] = False
    elif options.pop("left_padding", False):
        options["mask"] = np.ones((batch, 1, 1, key_len), bool)
        options["mask"][1, ..., :5] = False
    else:
        options["mask"] = _rows_removed(rng, batch, heads, query_len, key_len)
    bias = rng.normal(size=(1, heads, query_len, key_len)) if options.pop("bias", False) else None
    tensors = [query, key, value] + ([] if bias is None else [bias])
    output_grad = rng.normal(size=query.shape)

    def keras_op(flash):
        return lambda q, k, v, b=None: keras.ops.dot_product_attention(
            q, k, v, bias=b, flash_attention=flash, **options
        )

    want = np.asarray(keras_op(False)(*tensors))  # Keras's own op (`disable()` is in force)
    want_grads = output_gradients(keras_op(False), tensors, output_grad)
    keras_attn.enable()
    got = np.asarray(keras_op(flash_attention)(*tensors))
    got_grads = output_gradients(keras_op(flash_attention), tensors, output_grad)
    assert calls_to_our_op  # our kernel ran

    causal = np.tri(query_len, key_len, dtype=bool) if options.get("is_causal") else True
    assert (~np.any(options["mask"] & causal, -1)).any()  # the case removes whole rows
    assert keras.backend.standardize_dtype(got.dtype) == "float64"
    # Keras's default scale is a float32 `1 / sqrt(depth)`, ours float64: 1e-8 apart in float64.
    np.testing.assert_allclose(got, want, atol=1e-6)
    for name_, got_one, want_one in zip(("query", "key", "value", "bias"), got_grads, want_grads):
        np.testing.assert_allclose(got_one, want_one, atol=1e-6, err_msg=name_)


def test_keras_signature_op_gives_a_query_without_keys_the_mean_of_the_values():
    query, key, value, _ = _case("plain")
    mask = np.ones((BATCH, 1, QUERY_LEN, KEY_LEN), bool)
    mask[0, 0, 7] = False
    got = np.asarray(dot_product_attention(query, key, value, mask=mask, flash_attention=True))
    np.testing.assert_allclose(got[0, 7], value[0].mean(axis=0), atol=FLOAT32_ATOL)
    real = np.ones((BATCH, QUERY_LEN), bool)
    real[0, 7] = False
    np.testing.assert_allclose(got[real], _reference(query, key, value, mask=mask)[real], atol=FLOAT32_ATOL)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(attn_logits_soft_cap=-30.0), "attn_logits_soft_cap=-30.0"),
        (dict(flash_attention="yes"), "flash_attention='yes'"),
        (dict(mask=np.ones((1, 1, 1, QUERY_LEN, KEY_LEN), bool)), "mask.shape=(1, 1, 1, 150, 290)"),
    ],
)
def test_bad_arguments_are_named(arguments, message):
    query, key, value, _ = _case("plain")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dot_product_attention(query, key, value, **arguments)


@pytest.mark.parametrize("flash_attention", ["no", 1, np.float32(1.0)])
def test_enabled_op_checks_flash_attention_as_keras_signature_does(flash_attention, calls_to_our_op):
    query, key, value, _ = _case("plain")
    keras_attn.enable()
    message = f"`flash_attention` must be True, False or None. Received: flash_attention={flash_attention!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        keras.ops.dot_product_attention(query, key, value, flash_attention=flash_attention)
    assert calls_to_our_op == []


def test_keras_flash_attention_raises_on_tensorflow_until_enabled_and_again_after_disable(calls_to_our_op):
    query, key, value, options = _case("everything", seed=6)
    with pytest.raises(ValueError, match="Flash attention is not supported in tensorflow backend"):
        keras.ops.dot_product_attention(query, key, value, flash_attention=True, **options)
    keras_attn.enable()
    keras_attn.enable()  # idempotent
    assert keras_attn.ops.is_enabled()
    got = keras.ops.dot_product_attention(query, key, value, flash_attention=True, **options)
    np.testing.assert_allclose(np.asarray(got), _reference(query, key, value, **options), atol=FLOAT32_ATOL)
    assert [call["flash_attention"] for call in calls_to_our_op] == [True]
    keras_attn.disable()
    keras_attn.disable()  # idempotent
    assert not keras_attn.ops.is_enabled()
    with pytest.raises(ValueError, match="Flash attention is not supported in tensorflow backend"):
        keras.ops.dot_product_attention(query, key, value, flash_attention=True, **options)
    assert len(calls_to_our_op) == 1


def test_the_switch_replaces_what_keras_op_calls_in_the_pinned_keras():
    # The one internal the switch relies on: `keras.ops.dot_product_attention` looks the backend
    # function up as `keras.src.backend.nn.dot_product_attention` at each call.
    from keras.src import backend
    from keras.src.backend.tensorflow import nn as tensorflow_nn

    assert backend.nn is tensorflow_nn
    original = tensorflow_nn.dot_product_attention
    keras_attn.enable()
    assert tensorflow_nn.dot_product_attention is keras_flash.routed_dot_product_attention
    keras_attn.disable()
    assert tensorflow_nn.dot_product_attention is original


def test_flash_false_keeps_keras_own_path_while_enabled(calls_to_our_op):
    query, key, value, _ = _case("plain")
    keras_attn.enable()
    keras.ops.dot_product_attention(query, key, value, flash_attention=False)
    assert calls_to_our_op == []


def test_enabled_switch_runs_in_a_compiled_training_step_with_gradients(calls_to_our_op):
    query, key, value, options = _case("causal", seed=7)
    output_grad = np.random.default_rng(8).normal(size=query.shape).astype("float32")
    keras_attn.enable()

    @tf.function
    def keras_flash_op(q, k, v):
        return keras.ops.dot_product_attention(q, k, v, flash_attention=True, **options)

    got = output_gradients(keras_flash_op, [query, key, value], output_grad)
    want = reference.attention_gradients(query, key, value, output_grad, **options)[:3]
    for got_one, want_one in zip(got, want):
        np.testing.assert_allclose(got_one, want_one, atol=1e-4)
    assert calls_to_our_op


def _keras_mha_pair():
    """Two Keras `MultiHeadAttention` layers with the same weights, built while flash is
    enabled (`flash_attention=None`, Keras's default) and disabled."""
    x = np.random.default_rng(9).normal(size=(BATCH, QUERY_LEN, 32)).astype("float32")
    keras.config.enable_flash_attention()
    with_flash = keras.layers.MultiHeadAttention(4, 8)
    with_flash(x, x)
    keras.config.disable_flash_attention()
    without = keras.layers.MultiHeadAttention(4, 8)
    without(x, x)
    without.set_weights(with_flash.get_weights())
    keras.config.enable_flash_attention()
    return x, with_flash, without


def test_keras_multi_head_attention_runs_our_kernel_under_enable_flash_attention(calls_to_our_op):
    x, with_flash, without = _keras_mha_pair()
    padding = np.ones((BATCH, QUERY_LEN), bool)
    padding[1, 120:] = False
    keras_attn.enable()
    keras.config.enable_flash_attention()
    got = with_flash(x, x, attention_mask=padding[:, None, :] & padding[:, :, None], use_causal_mask=True)
    assert len(calls_to_our_op) == 1
    keras.config.disable_flash_attention()
    want = without(x, x, attention_mask=padding[:, None, :] & padding[:, :, None], use_causal_mask=True)
    assert len(calls_to_our_op) == 1  # a layer built with flash disabled keeps Keras's path
    np.testing.assert_allclose(np.asarray(got)[padding], np.asarray(want)[padding], atol=FLOAT32_ATOL)


def test_keras_multi_head_attention_with_dropout_keeps_keras_path_under_enable(calls_to_our_op):
    """Keras applies attention dropout outside its op, so a layer built with `dropout>0` never calls it:
    `enable()` cannot reach it (`keras_attn.convert` does, tests/test_convert.py)."""
    x = np.random.default_rng(10).normal(size=(BATCH, 16, 32)).astype("float32")
    layer = keras.layers.MultiHeadAttention(4, 8, dropout=0.1)
    keras_attn.enable()
    layer(x, x, training=True)
    layer(x, x, training=False)
    assert calls_to_our_op == []


def test_keras_multi_head_attention_with_flash_true_trains_once_enabled(calls_to_our_op):
    x, _, without = _keras_mha_pair()
    layer = keras.layers.MultiHeadAttention(4, 8, flash_attention=True)
    with pytest.raises(ValueError, match="Flash attention is not supported in tensorflow backend"):
        layer(x, x)
    keras_attn.enable()
    layer.set_weights(without.get_weights())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, x, use_causal_mask=True) ** 2)
    got = tape.gradient(loss, layer.trainable_variables)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(without(x, x, use_causal_mask=True) ** 2)
    want = tape.gradient(loss, without.trainable_variables)
    for got_one, want_one in zip(got, want):
        np.testing.assert_allclose(np.asarray(got_one), np.asarray(want_one), rtol=1e-4, atol=1e-3)
    assert calls_to_our_op


def test_keras_hub_esm2_padded_batch_is_unchanged_by_enable(calls_to_our_op):
    # ESM masks the padded queries' whole rows: their outputs feed the next layer's real tokens.
    keras_hub = pytest.importorskip("keras_hub")
    if not hasattr(keras_hub.models, "ESMBackbone"):
        pytest.skip(f"keras-hub {keras_hub.__version__} has no ESMBackbone")
    keras.utils.set_random_seed(0)
    model = keras_hub.models.ESMBackbone(
        vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, dropout=0.0
    )
    token_ids = np.random.default_rng(10).integers(1, 24, (2, 12)).astype("int32")
    token_ids[1, 8:] = 0  # ESM's pad_token_id
    real = token_ids != 0
    weights = np.random.default_rng(11).normal(size=(16,)).astype("float32")

    def run():
        with tf.GradientTape() as tape:
            output = model({"token_ids": token_ids})
            loss = tf.reduce_sum(tf.where(real[..., None], output * weights, 0.0))
        return np.asarray(output), [
            np.asarray(tf.convert_to_tensor(g)) for g in tape.gradient(loss, model.trainable_variables)
        ]

    want, want_grads = run()
    keras_attn.enable()
    got, got_grads = run()
    assert len(calls_to_our_op) == 2  # each layer's attention ran on our op
    np.testing.assert_allclose(got[real], want[real], atol=1e-5)
    for got_one, want_one in zip(got_grads, want_grads):
        np.testing.assert_allclose(got_one, want_one, atol=1e-5 * max(1.0, np.abs(want_one).max()))
