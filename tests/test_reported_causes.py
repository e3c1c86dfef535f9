"""The causes an outside probe of the library's numerics and validation reported (issue 51), one test
each (the cause id in its name): the right number against an independent oracle (the float64
reference, the same layer on float inputs) where the input is valid, a `ValueError` naming the
argument and the value received where it is not. The soft cap's (S1, S2) are in
test_logit_soft_cap.py, the attention axes' (S3, U4, U5) in test_multi_head_attention.py."""

import re

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
