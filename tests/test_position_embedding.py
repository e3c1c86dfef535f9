import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import PositionEmbedding
from tests import layer_checks
from tests.layer_checks import run_layer_test


def built_layer(sequence_length=16, features=4):
    layer = PositionEmbedding(sequence_length)
    layer.build((None, None, features))
    return layer


@pytest.mark.parametrize("start_index", [0, 3, 10])
def test_returns_table_rows_broadcast_to_inputs(start_index):
    layer = built_layer()
    table = keras.ops.convert_to_numpy(layer.position_embeddings)
    inputs = np.random.default_rng(0).standard_normal((3, 6, 4)).astype("float32")
    got = keras.ops.convert_to_numpy(layer(inputs, start_index=start_index))
    np.testing.assert_array_equal(got, np.broadcast_to(table[start_index : start_index + 6], (3, 6, 4)))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_tensor_start_index_for_cached_decoding(jit_compile):
    layer = built_layer()
    table = keras.ops.convert_to_numpy(layer.position_embeddings)
    step = tf.function(lambda x, index: layer(x, start_index=index), jit_compile=jit_compile)
    for index in (0, 7, 15):
        got = keras.ops.convert_to_numpy(step(np.zeros((2, 1, 4), "float32"), tf.constant(index)))
        np.testing.assert_array_equal(got[:, 0], np.broadcast_to(table[index], (2, 4)))


def test_static_length_past_maximum_names_both_numbers():
    layer = PositionEmbedding(sequence_length=512)
    with pytest.raises(ValueError, match=r"600 exceeds sequence_length=512"):
        layer(np.zeros((1, 600, 4), "float32"))
    with pytest.raises(ValueError, match=r"510 \+ 3 = 513 exceeds sequence_length=512"):
        layer(np.zeros((1, 3, 4), "float32"), start_index=510)
    assert layer(np.zeros((1, 512, 4), "float32")).shape == (1, 512, 4)


def test_dynamic_length_past_maximum_fails_at_run_time_never_truncates():
    layer = PositionEmbedding(sequence_length=512)
    run = tf.function(layer, input_signature=[tf.TensorSpec((None, None, 4), tf.float32)])
    assert run(np.zeros((1, 512, 4), "float32")).shape == (1, 512, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"exceeds sequence_length=512[\s\S]*\[600\]"):
        run(np.zeros((1, 600, 4), "float32"))
    shifted = tf.function(lambda x, index: layer(x, start_index=index))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"exceeds sequence_length=512[\s\S]*\[513\]"):
        shifted(np.zeros((1, 3, 4), "float32"), tf.constant(510))


def test_mask_passes_through():
    token_ids = np.array([[3, 4, 0], [5, 0, 0]], "int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(token_ids)
    np.testing.assert_array_equal(PositionEmbedding(8)(embedded)._keras_mask, token_ids != 0)
    tokens = keras.Input((None,), dtype="int32")
    symbolic = PositionEmbedding(8)(keras.layers.Embedding(10, 4, mask_zero=True)(tokens))
    np.testing.assert_array_equal(keras.Model(tokens, symbolic._keras_mask)(token_ids), token_ids != 0)


def model_factory():
    inputs = keras.Input((None, 4))
    outputs = keras.layers.Add()([inputs, PositionEmbedding(8)(inputs)])
    return keras.Model(inputs, keras.layers.Dense(2)(outputs))


def test_serialization_mixed_precision_jit_gradients_fit():
    inputs = np.random.default_rng(1).standard_normal((2, 5, 4)).astype("float32")
    layer_checks.assert_serialization_round_trip(model_factory, inputs)
    layer_checks.assert_config_round_trip(PositionEmbedding(8, initializer="zeros"))
    layer_checks.assert_mixed_precision_close(model_factory, inputs)
    layer_checks.assert_jit_matches_eager(model_factory(), inputs)
    layer_checks.assert_gradients_match_finite_differences(model_factory, inputs)
    layer_checks.assert_fit_one_step(model_factory(), inputs, np.zeros((2, 5, 2), "float32"))


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="sequence_length=0"):
        PositionEmbedding(sequence_length=0)
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3\)"):
        PositionEmbedding(4)(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match="start_index=-1"):
        PositionEmbedding(4)(np.zeros((1, 2, 3), "float32"), start_index=-1)


def test_layer_contract():
    rng = np.random.default_rng(16)
    run_layer_test(
        PositionEmbedding,
        dict(sequence_length=8),
        rng.standard_normal((2, 5, 4)).astype("float32"),
        expected_num_trainable_weights=1,
    )
