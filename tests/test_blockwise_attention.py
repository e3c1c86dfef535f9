"""Blockwise attention against the NumPy float64 reference and the dense path, values and gradients.

Small blocks (8 queries x 16 keys) over lengths that are not multiples of them, so every test runs
several query chunks, several key blocks, padding and, under causal/window masks, block skipping.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.core import masks
from keras_attn.core import softmax
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import KERNELS
from keras_attn.kernels import blockwise as blockwise_module
from keras_attn.kernels.blockwise import blockwise_attention
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.patterns import Causal
from tests import reference
from tests.dispatch_rule import prefer_kernel
from tests.layer_checks import output_gradients

FLOAT32_ATOL = 1e-5
BLOCKS = dict(query_block_size=8, key_block_size=16)
BATCH, QUERY_LEN, KEY_LEN, HEADS, DEPTH, VALUE_DEPTH = 2, 37, 45, 3, 8, 5


def _inputs(rng, query_len=QUERY_LEN, key_len=KEY_LEN, value_depth=VALUE_DEPTH):
    shapes = ((BATCH, query_len, HEADS, DEPTH), (BATCH, key_len, HEADS, DEPTH), (BATCH, key_len, HEADS, value_depth))
    return [rng.normal(size=shape).astype("float32") for shape in shapes]


def _mask_cases(rng):
    """Every mask kind, with query rows that see no key at all in the explicit masks."""
    full_mask = rng.random((BATCH, HEADS, QUERY_LEN, KEY_LEN)) < 0.6
    full_mask[0, 1, [0, 9, 20]] = False
    full_mask[1, :, 36] = False
    padding = np.ones((BATCH, 1, 1, KEY_LEN), bool)
    padding[1, ..., 30:] = False
    return {
        "none": {},
        "causal": dict(is_causal=True),
        "window": dict(sliding_window=6),
        "causal_window": dict(is_causal=True, sliding_window=11),
        "padding": dict(mask=padding),
        "full_mask_with_empty_rows": dict(mask=full_mask),
        "causal_offset": dict(is_causal=True, query_offset=KEY_LEN - QUERY_LEN),
        "window_offset": dict(sliding_window=5, query_offset=3),
        "bias": dict(bias=rng.normal(size=(1, HEADS, QUERY_LEN, KEY_LEN)).astype("float32")),
        "key_bias_causal": dict(bias=rng.normal(size=(BATCH, 1, 1, KEY_LEN)).astype("float32"), is_causal=True),
        "bias_and_mask": dict(bias=rng.normal(size=(BATCH, HEADS, QUERY_LEN, 1)).astype("float32"), mask=full_mask),
    }


CASES = sorted(_mask_cases(np.random.default_rng(0)))


def _case(name):
    return _mask_cases(np.random.default_rng(0))[name]


def _reference(query, key, value, case):
    case = dict(case)
    offset = case.pop("query_offset", 0)
    if offset:
        # The reference aligns queries at the top left: prepend `offset` queries and drop them.
        padded = np.concatenate([np.zeros_like(query[:, :offset]), query], axis=1)
        extra = {
            name: np.pad(case[name], [(0, 0)] * 2 + [(offset, 0), (0, 0)]) for name in ("mask", "bias") if name in case
        }
        output, weights = reference.attention(padded, key, value, **{**case, **extra})
        return output[:, offset:], weights[:, :, offset:]
    return reference.attention(query, key, value, **case)


@pytest.mark.parametrize("name", CASES)
def test_matches_reference_and_dense_path(name):
    rng = np.random.default_rng(1)
    query, key, value = _inputs(rng)
    case = _case(name)
    expected, _ = _reference(query, key, value, case)
    output = blockwise_attention(query, key, value, scale=DEPTH**-0.5, **BLOCKS, **case).numpy()
    dense = scaled_dot_product_attention(query, key, value, implementation="dense", **case).numpy()
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    np.testing.assert_allclose(output, dense, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("name", CASES)
def test_gradients_match_dense_path(name):
    rng = np.random.default_rng(2)
    case = _case(name)
    bias = case.pop("bias", None)
    inputs = _inputs(rng) + ([] if bias is None else [bias])
    output_grad = rng.normal(size=(BATCH, QUERY_LEN, HEADS, VALUE_DEPTH)).astype("float32")

    def blockwise(query, key, value, bias=None):
        return blockwise_attention(query, key, value, bias=bias, scale=DEPTH**-0.5, **BLOCKS, **case)

    def dense(query, key, value, bias=None):
        return scaled_dot_product_attention(query, key, value, bias=bias, implementation="dense", **case)

    for got, want in zip(
        output_gradients(blockwise, inputs, output_grad), output_gradients(dense, inputs, output_grad)
    ):
        np.testing.assert_allclose(got, want, atol=FLOAT32_ATOL)


def test_fully_masked_rows_give_zero_output_and_zero_query_gradient():
    rng = np.random.default_rng(3)
    query, key, value = _inputs(rng)
    mask = rng.random((BATCH, 1, QUERY_LEN, KEY_LEN)) < 0.5
    mask[0, :, 12] = False
    mask[1] = False
    output_grad = np.ones((BATCH, QUERY_LEN, HEADS, VALUE_DEPTH), "float32")

    def attend(query, key, value):
        return blockwise_attention(query, key, value, mask=mask, scale=0.3, **BLOCKS)

    output = attend(query, key, value).numpy()
    query_grad, key_grad, value_grad = output_gradients(attend, (query, key, value), output_grad)
    assert np.all(output[0, 12] == 0.0) and np.all(output[1] == 0.0)
    assert np.all(query_grad[0, 12] == 0.0) and np.all(query_grad[1] == 0.0)
    assert np.all(key_grad[1] == 0.0) and np.all(value_grad[1] == 0.0)
    assert np.all(np.isfinite(query_grad))


@pytest.mark.parametrize(
    "structure", [dict(is_causal=True), dict(sliding_window=4), dict(is_causal=True, sliding_window=9)]
)
def test_blocks_outside_the_causal_or_window_band_are_never_computed(structure):
    # NaN keys/values wherever the structure masks every query: a computed block would multiply
    # zero weights by NaN values (and NaN logits) and poison the output and the gradients.
    rng = np.random.default_rng(4)
    query_len, key_len = 16, 96
    query, key, value = _inputs(rng, query_len=query_len, key_len=key_len)
    rows, cols = np.arange(query_len)[:, None], np.arange(key_len)[None, :]
    allowed = np.ones((query_len, key_len), bool)
    if structure.get("is_causal"):
        allowed &= cols <= rows
    if "sliding_window" in structure:
        allowed &= np.abs(rows - cols) < structure["sliding_window"]
    unseen_blocks = ~allowed.reshape(query_len, key_len // 16, 16).any(axis=(0, 2))  # per key block
    assert unseen_blocks.any()
    unseen = np.repeat(unseen_blocks, 16)
    poisoned_key, poisoned_value = key.copy(), value.copy()
    poisoned_key[:, unseen] = np.nan
    poisoned_value[:, unseen] = np.nan

    def attend(query, key, value):
        return blockwise_attention(query, key, value, scale=DEPTH**-0.5, **BLOCKS, **structure)

    output = attend(query, poisoned_key, poisoned_value).numpy()
    expected, _ = reference.attention(query, key, value, **structure)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    output_grad = np.ones_like(output)
    query_grad, key_grad, value_grad = output_gradients(attend, (query, poisoned_key, poisoned_value), output_grad)
    assert np.all(np.isfinite(query_grad))
    assert np.all(np.isfinite(key_grad[:, ~unseen])) and np.all(np.isfinite(value_grad[:, ~unseen]))


def _dropped_weights(seed, rate, case, query, key):
    """The dropped-out weights `(batch, heads, q, k)`: attend to one-hot values, one per key."""
    one_hot = np.broadcast_to(np.eye(KEY_LEN, dtype="float32")[None, :, None, :], (BATCH, KEY_LEN, HEADS, KEY_LEN))
    output = blockwise_attention(
        query,
        key,
        one_hot,
        scale=DEPTH**-0.5,
        dropout_rate=rate,
        training=True,
        seed_generator=keras.random.SeedGenerator(seed),
        **BLOCKS,
        **case,
    )  # (batch, q, heads, k)
    return np.transpose(output.numpy(), (0, 2, 1, 3))


def test_dropout_drops_normalised_weights_and_rescales_the_rest():
    rng = np.random.default_rng(5)
    query, key, _ = _inputs(rng)
    case, rate = dict(is_causal=True), 0.3
    _, weights = reference.attention(query, key, np.zeros_like(key), **case)
    dropped = _dropped_weights(7, rate, case, query, key)
    kept = dropped != 0.0
    np.testing.assert_allclose(dropped[kept], weights[kept] / (1.0 - rate), atol=FLOAT32_ATOL)
    drop_fraction = 1.0 - kept[weights > 0].mean()
    assert abs(drop_fraction - rate) < 0.05
    np.testing.assert_array_equal(_dropped_weights(7, rate, case, query, key), dropped)
    assert not np.array_equal(_dropped_weights(8, rate, case, query, key), dropped)


def test_dropout_gradients_use_the_forward_masks():
    rng = np.random.default_rng(6)
    query, key, value = _inputs(rng, value_depth=KEY_LEN)
    case, rate, seed = dict(sliding_window=20), 0.25, 11
    keep = _dropped_weights(seed, rate, case, query, key) != 0.0  # (batch, heads, q, k)
    output_grad = rng.normal(size=(BATCH, QUERY_LEN, HEADS, KEY_LEN)).astype("float32")

    def blockwise(query, key, value):
        return blockwise_attention(
            query,
            key,
            value,
            scale=DEPTH**-0.5,
            dropout_rate=rate,
            training=True,
            seed_generator=keras.random.SeedGenerator(seed),
            **BLOCKS,
            **case,
        )

    def dense_with_the_same_masks(query, key, value):
        mask = masks.sliding_window_mask(QUERY_LEN, KEY_LEN, case["sliding_window"])
        logits = softmax.attention_logits(query, key) * DEPTH**-0.5
        weights = softmax.masked_softmax(logits, mask) * keep / (1.0 - rate)
        return tf.einsum("bhqk,bkhd->bqhd", weights, value)

    inputs = (query, key, value)
    got_grads, want_grads = (
        output_gradients(blockwise, inputs, output_grad),
        output_gradients(dense_with_the_same_masks, inputs, output_grad),
    )
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got, want, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("dtype, atol", [("float64", 1e-12), ("float16", 2e-3), ("bfloat16", 2e-2)])
def test_other_dtypes_match_the_reference_and_keep_their_dtype(dtype, atol):
    rng = np.random.default_rng(14)
    query, key, value = (tf.constant(x, dtype) for x in _inputs(rng))
    with tf.GradientTape() as tape:
        tape.watch([query, key, value])
        output = blockwise_attention(query, key, value, is_causal=True, scale=DEPTH**-0.5, **BLOCKS)
        loss = tf.reduce_sum(tf.cast(output, "float32"))
    grads = tape.gradient(loss, [query, key, value])
    expected, _ = reference.attention(*(tf.cast(x, "float64").numpy() for x in (query, key, value)), is_causal=True)
    assert output.dtype == dtype and all(grad.dtype == dtype for grad in grads)
    np.testing.assert_allclose(tf.cast(output, "float64"), expected, atol=atol)


def test_no_dropout_outside_training():
    rng = np.random.default_rng(7)
    query, key, value = _inputs(rng)
    output = blockwise_attention(query, key, value, scale=0.5, dropout_rate=0.5, training=False, **BLOCKS)
    expected, _ = reference.attention(query, key, value, scale=0.5)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_compiled_forward_and_gradients(jit_compile):
    rng = np.random.default_rng(8)
    query, key, value = _inputs(rng)
    bias = rng.normal(size=(1, HEADS, QUERY_LEN, KEY_LEN)).astype("float32")
    output_grad = rng.normal(size=(BATCH, QUERY_LEN, HEADS, VALUE_DEPTH)).astype("float32")
    case = dict(is_causal=True, sliding_window=13)

    def blockwise(query, key, value, bias):
        return blockwise_attention(query, key, value, bias=bias, scale=DEPTH**-0.5, **BLOCKS, **case)

    @tf.function(jit_compile=jit_compile)
    def compiled(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            output = blockwise(*inputs)
            loss = tf.reduce_sum(output * output_grad)
        return output, tape.gradient(loss, inputs)

    inputs = [tf.constant(x) for x in (query, key, value, bias)]
    output, grads = compiled(*inputs)
    expected, _ = reference.attention(query, key, value, bias=bias, **case)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    eager_grads = output_gradients(blockwise, (query, key, value, bias), output_grad)
    for got, want in zip(grads, eager_grads):
        np.testing.assert_allclose(got, want, atol=FLOAT32_ATOL)


def test_dynamic_lengths_in_tf_function():
    rng = np.random.default_rng(9)
    spec = tf.TensorSpec((None, None, HEADS, DEPTH), tf.float32)

    @tf.function(input_signature=[spec, spec, spec])
    def attend(query, key, value):
        return blockwise_attention(query, key, value, is_causal=True, scale=DEPTH**-0.5, **BLOCKS)

    for query_len in (5, 40):
        query, key, value = _inputs(rng, query_len=query_len, key_len=query_len, value_depth=DEPTH)
        expected, _ = reference.attention(query, key, value, is_causal=True)
        np.testing.assert_allclose(attend(query, key, value), expected, atol=FLOAT32_ATOL)


def test_grouped_query_heads_through_the_core():
    rng = np.random.default_rng(10)
    query = rng.normal(size=(BATCH, 40, 4, DEPTH)).astype("float32")
    key, value = (rng.normal(size=(BATCH, 40, 2, DEPTH)).astype("float32") for _ in range(2))
    output = scaled_dot_product_attention(query, key, value, is_causal=True, implementation="blockwise")
    expected, _ = reference.attention(query, key, value, is_causal=True)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)


def test_auto_runs_blockwise_where_the_calibration_predicts_it_fastest_unless_weights_are_returned(
    monkeypatch, tmp_path
):
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return blockwise_attention(*args, **kwargs)

    monkeypatch.setattr(blockwise_module, "blockwise_attention", spy)  # the name its `attend` calls
    rng = np.random.default_rng(11)
    medium = _inputs(rng, query_len=30, key_len=30, value_depth=DEPTH)
    long = _inputs(rng, query_len=40, key_len=40, value_depth=DEPTH)
    prefer_kernel(monkeypatch, tmp_path / "dense", "dense")
    scaled_dot_product_attention(*medium, is_causal=True)
    assert not calls
    prefer_kernel(monkeypatch, tmp_path / "blockwise", "blockwise")
    scaled_dot_product_attention(*long, is_causal=True, return_weights=True)
    assert not calls
    output = scaled_dot_product_attention(*medium, is_causal=True)
    assert len(calls) == 1 and isinstance(calls[0]["pattern"], Causal)
    expected, _ = reference.attention(*medium, is_causal=True)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    scaled_dot_product_attention(*long)
    assert len(calls) == 2 and calls[1]["pattern"] is None


def test_multi_head_attention_implementations_agree_and_round_trip():
    rng = np.random.default_rng(12)
    inputs = rng.normal(size=(2, 33, 16)).astype("float32")
    padding = np.ones((2, 33), bool)
    padding[1, 25:] = False
    dense = MultiHeadAttention(num_heads=2, key_dim=8, implementation="dense")
    blockwise = MultiHeadAttention.from_config({**dense.get_config(), "implementation": "blockwise"})
    expected = dense(inputs, inputs, use_causal_mask=True, value_mask=padding)
    blockwise(inputs, inputs)
    blockwise.set_weights(dense.get_weights())
    output = blockwise(inputs, inputs, use_causal_mask=True, value_mask=padding)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    assert MultiHeadAttention.from_config(blockwise.get_config()).implementation == "blockwise"


def test_bad_arguments_raise_value_errors_naming_them():
    rng = np.random.default_rng(13)
    query, key, value = _inputs(rng)
    with pytest.raises(ValueError, match="implementation=.fast."):
        scaled_dot_product_attention(query, key, value, implementation="fast")
    with pytest.raises(ValueError, match="return_weights=True"):
        scaled_dot_product_attention(query, key, value, implementation="blockwise", return_weights=True)
    with pytest.raises(ValueError, match="query_block_size=0"):
        blockwise_attention(query, key, value, query_block_size=0)
    with pytest.raises(ValueError, match="key_block_size=2.5"):
        blockwise_attention(query, key, value, key_block_size=2.5)
    with pytest.raises(ValueError, match="implementation='flash'"):
        MultiHeadAttention(num_heads=2, key_dim=4, implementation="flash")
    ids = np.ones((BATCH, QUERY_LEN), np.int32)
    with pytest.raises(ValueError, match="come together"):
        blockwise_attention(query, key, value, query_segment_ids=ids)
    with pytest.raises(ValueError, match=r"key_segment_ids.*one id per token \(45\)"):
        blockwise_attention(query, key, value, query_segment_ids=ids, key_segment_ids=ids)
    with pytest.raises(ValueError, match="query_segment_ids.dtype=float32"):
        blockwise_attention(
            query, key, value, query_segment_ids=ids.astype("float32"), key_segment_ids=np.ones((BATCH, KEY_LEN))
        )


def _kernel_spy(monkeypatch):
    """The names of the kernels `scaled_dot_product_attention` runs, in order."""
    ran = []
    for name, kernel in KERNELS.items():
        monkeypatch.setattr(
            kernel, "attend", lambda call, name=name, attend=kernel.attend: ran.append(name) or attend(call)
        )
    return ran


def test_flash_attention_true_runs_the_blockwise_kernel_with_the_dense_result(monkeypatch):
    """Keras's `flash_attention=True` means "never materialise the attention matrix": on a short
    input `"auto"` would take the dense kernel, flash attention takes blockwise, dropout included."""
    ran = _kernel_spy(monkeypatch)
    rng = np.random.default_rng(14)
    inputs = rng.normal(size=(2, 33, 16)).astype("float32")
    padding = np.ones((2, 33), bool)
    padding[1, 25:] = False
    dense = MultiHeadAttention(num_heads=2, key_dim=8)
    flash = MultiHeadAttention.from_config({**dense.get_config(), "flash_attention": True})
    expected = dense(inputs, inputs, use_causal_mask=True, value_mask=padding)
    flash(inputs, inputs)
    flash.set_weights(dense.get_weights())
    ran.clear()
    output = flash(inputs, inputs, use_causal_mask=True, value_mask=padding)
    assert ran == ["blockwise"]
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    assert MultiHeadAttention.from_config(flash.get_config()).flash_attention is True
    with_dropout = MultiHeadAttention(num_heads=2, key_dim=8, dropout=0.5, flash_attention=True)
    ran.clear()
    with_dropout(inputs, inputs, training=True)
    assert ran == ["blockwise"]


def test_flash_attention_false_forces_the_dense_kernel(monkeypatch, tmp_path):
    prefer_kernel(monkeypatch, tmp_path, "blockwise")  # "auto" would take blockwise
    ran = _kernel_spy(monkeypatch)
    inputs = np.random.default_rng(15).normal(size=(1, 16, 8)).astype("float32")
    MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    assert ran == ["blockwise"]
    ran.clear()
    MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=False)(inputs, inputs)
    assert ran == ["dense"]


def test_flash_attention_refuses_returned_scores_as_keras_does():
    keras_sentence = "Returning attention scores is not supported when flash attention is enabled."
    inputs = np.zeros((1, 4, 8), "float32")
    keras_layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    with pytest.raises(ValueError, match=keras_sentence):
        keras_layer(inputs, inputs, return_attention_scores=True)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    for query in (inputs, keras.Input((None, 8))):  # eager and symbolic
        with pytest.raises(ValueError, match=keras_sentence) as error:
            layer(query, query, return_attention_scores=True)
        assert "Received: flash_attention=True, return_attention_scores=True" in str(error.value)


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(flash_attention=True, implementation="dense"), "flash_attention=True, implementation='dense'"),
        (dict(flash_attention=True, implementation="chunked"), "flash_attention=True, implementation='chunked'"),
        (dict(flash_attention=False, implementation="blockwise"), "flash_attention=False, implementation='blockwise'"),
        (dict(flash_attention=True, hard=True), "flash_attention=True, hard=True"),
    ],
)
def test_flash_attention_conflicting_with_the_kernel_names_both(arguments, named):
    with pytest.raises(ValueError, match=named):
        MultiHeadAttention(num_heads=2, key_dim=4, **arguments)


def test_flash_attention_true_on_other_attention_axes_is_refused():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1, 2), flash_attention=True)
    with pytest.raises(ValueError, match="flash_attention=True"):
        layer(np.zeros((1, 3, 4, 8), "float32"), np.zeros((1, 3, 4, 8), "float32"))
