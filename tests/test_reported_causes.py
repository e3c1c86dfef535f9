"""The causes an outside probe of the library's numerics and validation reported (issue 51), one test
each (the cause id in its name): the right number against an independent oracle (the float64
reference, the same layer on float inputs) where the input is valid, a `ValueError` naming the
argument and the value received where it is not. The soft cap's (S1, S2) are in
test_logit_soft_cap.py."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from keras_attn import packing
from tests import reference

RNG = np.random.default_rng(51)
INTS = RNG.integers(-3, 4, size=(2, 3, 4)).astype("int32")
HEADS = RNG.normal(size=(1, 4, 1, 2)).astype("float32")


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_s7_attention_pooling_reads_int_and_bool_inputs_as_their_float_values(dtype):
    """S7: the learnt query was cast to the input dtype (truncated, outputs off by up to 5.2)."""
    layer = keras_attn.AttentionPooling(num_heads=2, key_dim=2)
    inputs = INTS.astype(dtype)
    want = np.asarray(layer(inputs.astype("float32")))
    np.testing.assert_allclose(np.asarray(layer(inputs)), want, atol=1e-6)


def test_s8_a_negative_scalar_tensor_query_offset_is_refused_like_the_int():
    """S8: `query_offset=tf.constant(-3)` was taken eagerly where `-3` is refused; a valid tensor still runs
    (as the int does), and a symbolic one (a graph's) is left to the graph."""
    with pytest.raises(ValueError, match=re.escape("`query_offset` must be an int in [0, 2147483647]") + ".*numpy=-3"):
        keras_attn.scaled_dot_product_attention(HEADS, HEADS, HEADS, is_causal=True, query_offset=tf.constant(-3))
    want, _ = reference.attention(HEADS, HEADS, HEADS, mask=np.tri(4, 4, 2, dtype=bool))
    got = keras_attn.scaled_dot_product_attention(HEADS, HEADS, HEADS, is_causal=True, query_offset=tf.constant(2))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
    in_graph = tf.function(
        lambda offset: keras_attn.scaled_dot_product_attention(HEADS, HEADS, HEADS, is_causal=True, query_offset=offset)
    )
    np.testing.assert_allclose(np.asarray(in_graph(tf.constant(2))), want, atol=1e-6)


# Layers Keras's own layers stand for (`Dense`, `MultiHeadAttention`, `LayerNormalization` promote int
# and bool inputs to float): the same layer on the inputs cast to float is the oracle.
INPUT_LAYERS = {
    "TransformerEncoder": lambda: keras_attn.TransformerEncoder(intermediate_dim=4, num_heads=2),
    "TransformerDecoder": lambda: keras_attn.TransformerDecoder(intermediate_dim=4, num_heads=2),
    "SinusoidalPositionEncoding": lambda: keras_attn.SinusoidalPositionEncoding(),
}


@pytest.mark.parametrize("name", sorted(INPUT_LAYERS))
@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_u6_int_and_bool_inputs_are_read_as_their_float_values_as_keras_layers_read_them(name, dtype):
    """U6: int or bool inputs raised raw TensorFlow errors."""
    layer = INPUT_LAYERS[name]()
    inputs = INTS.astype(dtype)
    want = np.asarray(layer(inputs.astype("float32")))
    got = layer(inputs)
    assert got.dtype == "float32"
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 0, 4), (0, 3, 4)], ids=["empty sequence", "empty batch"])
def test_u7_attention_pooling_of_an_empty_sequence_or_batch_is_zero(shape):
    """U7: "Cannot compute the max of an empty tensor". A row with no token pools to zeros (as a
    fully padded row does); an empty batch gives no rows."""
    layer = keras_attn.AttentionPooling(num_heads=2, key_dim=2)
    layer.build((None, None, shape[2]))
    layer.attention._output_dense.bias.assign(np.ones(shape[2]))  # what a row reading nothing must not output
    got = np.asarray(layer(np.zeros(shape, "float32")))
    assert got.shape == (shape[0], shape[2])
    np.testing.assert_array_equal(got, np.zeros((shape[0], shape[2])))


@pytest.mark.parametrize("queries", [1, 3])
def test_n1_a_query_with_no_keys_at_all_outputs_zero_not_the_bias(queries):
    """N1 (found fixing U7): keys of length 0 raised (one query) or gave the output projection's bias
    (several), where the documented output of a query without any key is zero."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, bias_initializer="ones")
    got = np.asarray(layer(np.ones((2, queries, 4), "float32"), np.ones((2, 0, 4), "float32")))
    np.testing.assert_array_equal(got, np.zeros((2, queries, 4)))


@pytest.mark.parametrize("bias", ["ALiBi", "RelativePositionBias"])
def test_u8_position_tensors_of_different_batches_are_refused_naming_them(bias):
    """U8: a raw `Sub` error. A batch of 1 still stands for every row."""
    layer = getattr(keras_attn, bias)(num_heads=2)
    positions = np.arange(6, dtype="int32").reshape(2, 3)
    with pytest.raises(ValueError, match=r"`query_positions` and `key_positions` .*key_positions.shape=\(3, 3\)"):
        layer(positions, np.zeros((3, 3), "int32"))
    shared = np.asarray(layer(positions, positions[:1]))
    for row in range(2):
        np.testing.assert_allclose(shared[row], np.asarray(layer(positions[row], positions[0]))[0])


def test_u9_merge_masks_refuses_masks_that_do_not_broadcast_naming_them():
    """U9: a raw `LogicalAnd` error."""
    with pytest.raises(ValueError, match=re.escape("Received: masks[0].shape=(2, 3), masks[2].shape=(4, 3)")):
        keras_attn.merge_masks(np.ones((2, 3), bool), None, np.ones((4, 3), bool))
    merged = keras_attn.merge_masks(np.array([[True], [False]]), np.array([True, False, True]))
    np.testing.assert_array_equal(np.asarray(merged), [[True, False, True], [False, False, False]])


@pytest.mark.parametrize("mask_shape", [(4, 3), (2, 2, 3)])
def test_u9_masked_softmax_refuses_a_mask_that_does_not_broadcast_to_the_logits(mask_shape):
    """U9: a raw `SelectV2` error (or, for a mask of higher rank, weights of the mask's shape)."""
    with pytest.raises(
        ValueError, match=re.escape(f"`mask` must be broadcastable to `logits`. Received: mask.shape={mask_shape}")
    ):
        keras_attn.masked_softmax(np.ones((2, 3), "float32"), np.ones(mask_shape, bool))


def test_u9_pack_refuses_a_list_naming_dataset():
    """U9: `AttributeError: 'list' object has no attribute 'element_spec'`."""
    with pytest.raises(ValueError, match=re.escape("Received: dataset=[[1, 2], [3]] (a list)")):
        packing.pack([[1, 2], [3]], row_length=4)


# Attention over several axes (or another one than the sequence): Keras's layer with the same weights
# and the same mask written out in Keras's layout `(batch, <other axes>, <query axes>, <key axes>)`
# is the oracle where a query sees a key; a query that sees none outputs zeros (the documented contract).
IMAGE = RNG.normal(size=(2, 3, 2, 4)).astype("float32")  # (batch, rows, columns, features)
ROWS_PADDED = np.ones((2, 3, 2), bool)
ROWS_PADDED[1, 2] = False  # the last row of the second image is padding
COLUMN_PADDED = np.ones((2, 3, 2), bool)
COLUMN_PADDED[0, :, 1] = False


def _layers(attention_axes):
    ours = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=attention_axes)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=attention_axes)
    ours(IMAGE, IMAGE), theirs(IMAGE, IMAGE)
    weights = [RNG.normal(size=w.shape).astype("float32") for w in ours.get_weights()]  # biases not zero
    ours.set_weights(weights), theirs.set_weights(weights)
    return ours, theirs


def _keras_layout(query_mask, key_mask, attention_axes):
    """The `(batch, <other axes>, <query axes>, <key axes>)` mask of padding masks over (rows, columns)."""
    if attention_axes == (1, 2):
        return query_mask[:, :, :, None, None] & key_mask[:, None, None, :, :]
    return query_mask.transpose(0, 2, 1)[:, :, :, None] & key_mask.transpose(0, 2, 1)[:, :, None, :]  # over rows


@pytest.mark.parametrize("attention_axes", [(1, 2), (1,)])
@pytest.mark.parametrize("masks", ["query_mask", "value_mask", "query_mask and key_mask", "attention_mask"])
def test_s3_u4_padding_masks_over_attention_axes_match_keras_and_keyless_queries_output_zero(attention_axes, masks):
    """U4: `query_mask` over several axes raised (BroadcastTo, "axis -7 out of bounds"); S3: a padded or
    keyless query output the output projection's bias, not zero."""
    ours, theirs = _layers(attention_axes)
    query_mask = ROWS_PADDED if "query_mask" in masks else np.ones_like(ROWS_PADDED)
    key_mask = COLUMN_PADDED if masks in ("value_mask", "query_mask and key_mask") else np.ones_like(ROWS_PADDED)
    full = _keras_layout(query_mask, key_mask, attention_axes)
    if masks == "attention_mask":
        full = full & _keras_layout(ROWS_PADDED, np.ones_like(ROWS_PADDED), attention_axes)
        given = dict(attention_mask=full)
    else:
        given = {"query_mask": query_mask} if "query_mask" in masks else {}
        given.update({"key_mask" if "key_mask" in masks else "value_mask": key_mask} if "mask" in masks[-9:] else {})
    got = np.asarray(ours(IMAGE, IMAGE, **given))
    want = np.asarray(theirs(IMAGE, IMAGE, attention_mask=full))
    keyless = ~full.any(axis=(-2, -1) if attention_axes == (1, 2) else -1)  # (batch, <query positions>)
    if attention_axes == (1,):
        keyless = keyless.transpose(0, 2, 1)  # (batch, columns, rows) -> (batch, rows, columns)
    assert keyless.any() or masks == "value_mask"  # padded rows: queries without keys
    np.testing.assert_array_equal(got[keyless], 0.0)
    np.testing.assert_allclose(got[~keyless], want[~keyless], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "attention_axes", [(1, 1), (1.0,), (1.0, 2.0), [1, True]], ids=["repeated", "float", "floats", "bool"]
)
def test_u5_attention_axes_that_name_no_axis_once_are_refused_naming_them(attention_axes):
    """U5: raw errors (an IndexError for floats, an einsum's for a repeated axis)."""
    with pytest.raises(ValueError, match=re.escape(f"Received: attention_axes={attention_axes!r}")):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=attention_axes)
    if attention_axes == (1, 1):  # the same axis twice from both ends is refused when the rank is known
        with pytest.raises(ValueError, match=r"distinct axes .*attention_axes=\(1, -3\)"):
            keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1, -3))(IMAGE, IMAGE)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("attention_mask", (2, 3, 2, 3, 5)),
        ("attention_mask", (3, 3, 2, 3, 2)),
        ("query_mask", (2, 3, 5)),
        ("value_mask", (2, 3)),
    ],
)
def test_u5_a_mask_that_does_not_fit_the_attention_axes_is_refused_naming_it(name, shape):
    """U5: raw BroadcastTo errors."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1, 2))
    with pytest.raises(
        ValueError,
        match=re.escape(f"`{name}` must be broadcastable to") + ".*" + re.escape(f"Received: {name}.shape={shape}"),
    ):
        layer(IMAGE, IMAGE, **{name: np.ones(shape, bool)})


def test_u5_a_key_of_another_size_off_the_attention_axes_is_blamed_on_that_axis_not_the_batch():
    """U5: a key whose columns differ (attention over the rows only) was reported as a batch mismatch
    of the flattened tensors."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1,))
    key = np.zeros((2, 3, 5, 4), "float32")
    with pytest.raises(ValueError, match=r"the axes attention does not run over \(0, 2 .*value.shape=\(2, 3, 5, 4\)"):
        layer(IMAGE, key)
