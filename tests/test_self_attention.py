"""SelfAttention against MultiHeadAttention(x, x) with the same weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.self_attention import SelfAttention
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import run_layer_test

CONFIG = dict(num_heads=4, key_dim=3, value_dim=5, num_key_value_heads=2, bias_initializer="random_normal")
ATOL = 1e-5


def _twins(x, **config):
    layer = SelfAttention(**config)
    layer(x)
    reference = MultiHeadAttention(**config)
    reference(x, x)
    reference.set_weights(layer.get_weights())
    return layer, reference


def test_weights_are_those_of_multi_head_attention():
    x = np.random.default_rng(0).standard_normal((2, 6, 8)).astype("float32")
    layer, reference = _twins(x, **CONFIG)
    assert [w.shape for w in layer.weights] == [w.shape for w in reference.weights]
    assert [w.path.split("/", 1)[1] for w in layer.weights] == [w.path.split("/", 1)[1] for w in reference.weights]


@pytest.mark.parametrize("with_masks", [False, True])
def test_equals_multi_head_attention_on_the_same_tensor(with_masks):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 8)).astype("float32")
    layer, reference = _twins(x, **CONFIG, sliding_window=3)
    masks = {}
    if with_masks:
        masks = dict(
            attention_mask=rng.random((2, 6, 6)) < 0.8,
            attention_bias=rng.standard_normal((1, 4, 6, 6)).astype("float32"),
        )
    padding = np.arange(6)[None, :] < np.array([[6], [4]])
    output, scores = layer(x, query_mask=padding, value_mask=padding, return_attention_scores=True, **masks)
    expected, expected_scores = reference(
        x, x, query_mask=padding, value_mask=padding, return_attention_scores=True, **masks
    )
    np.testing.assert_allclose(output, expected, atol=ATOL)
    np.testing.assert_allclose(scores, expected_scores, atol=ATOL)
    assert np.all(scores.numpy()[1, :, 4:] == 0) and np.all(scores.numpy()[1, :, :, 4:] == 0)


def _token_model():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 8, mask_zero=True)(tokens)
    attended = SelfAttention(**CONFIG)(embedded)
    return keras.Model(tokens, attended)


def test_keras_mask_from_embedding_is_used_and_propagated():
    tokens = np.array([[5, 3, 8, 1, 0, 0], [7, 2, 0, 0, 0, 0]], "int32")
    model = _token_model()
    embedding, layer = model.layers[1], model.layers[2]
    embedded = embedding(tokens)
    output = layer(embedded)
    np.testing.assert_array_equal(output._keras_mask, tokens != 0)
    explicit = layer(
        tf.identity(embedded), query_mask=tokens != 0, value_mask=tokens != 0
    )  # a copy carries no Keras mask
    np.testing.assert_allclose(output, explicit, atol=ATOL)
    np.testing.assert_allclose(model(tokens), explicit, atol=ATOL)
    unmasked = layer(tf.identity(embedded))
    assert not np.allclose(unmasked.numpy()[0, :4], explicit.numpy()[0, :4], atol=ATOL)


def test_serialization_round_trip():
    tokens = np.array([[5, 3, 8, 1, 0, 0], [7, 2, 0, 0, 0, 0]], "int32")
    reloaded = assert_serialization_round_trip(_token_model, tokens)
    assert type(reloaded.layers[2]) is SelfAttention


def test_layer_contract():
    rng = np.random.default_rng(11)
    run_layer_test(
        SelfAttention,
        dict(num_heads=2, key_dim=4, use_gate=True),
        rng.standard_normal((2, 5, 8)).astype("float32"),
        dict(return_attention_scores=True),
        expected_num_trainable_weights=10,
        unchanged_ok=("key/bias",),
    )
