"""CausalSelfAttention against MultiHeadAttention(x, x, use_causal_mask=True) and its own full pass."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.layers.causal_self_attention import CausalSelfAttention
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import run_layer_test

CONFIG = dict(num_heads=4, key_dim=3, num_key_value_heads=2, bias_initializer="random_normal")
BATCH, LENGTH, FEATURES = 2, 6, 8
ATOL = 1e-5


def _inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((BATCH, LENGTH, FEATURES)).astype("float32")


def _empty_cache():
    return keras.ops.zeros((BATCH, 2, LENGTH, CONFIG["num_key_value_heads"], CONFIG["key_dim"]))


def _layer(x, **config):
    layer = CausalSelfAttention(**CONFIG, **config)
    layer(x)
    return layer


@pytest.mark.parametrize("sliding_window", [None, 2])
def test_equals_causal_multi_head_attention(sliding_window):
    x = _inputs()
    layer = _layer(x, sliding_window=sliding_window)
    reference = MultiHeadAttention(**CONFIG, sliding_window=sliding_window)
    reference(x, x)
    reference.set_weights(layer.get_weights())
    padding = np.arange(LENGTH)[None, :] < np.array([[LENGTH], [3]])
    output, scores = layer(x, query_mask=padding, value_mask=padding, return_attention_scores=True)
    expected, expected_scores = reference(
        x, x, query_mask=padding, value_mask=padding, use_causal_mask=True, return_attention_scores=True
    )
    np.testing.assert_allclose(output, expected, atol=ATOL)
    np.testing.assert_allclose(scores, expected_scores, atol=ATOL)
    assert np.all(np.triu(scores.numpy(), k=1) == 0)


@pytest.mark.parametrize("sliding_window", [None, 3])
def test_cached_decoding_matches_the_full_pass(sliding_window):
    x = _inputs(1)
    layer = _layer(x, sliding_window=sliding_window)
    full = layer(x).numpy()
    prefill = 2
    output, cache = layer(x[:, :prefill], cache=_empty_cache(), cache_update_index=0)
    np.testing.assert_allclose(output, full[:, :prefill], atol=ATOL)
    for index in range(prefill, LENGTH):
        output, cache = layer(x[:, index : index + 1], cache=cache, cache_update_index=index)
        np.testing.assert_allclose(output, full[:, index : index + 1], atol=ATOL)
    keys = layer.key_dense(x).numpy()  # (batch, length, kv_heads, key_dim)
    np.testing.assert_allclose(cache[:, 0], keys, atol=ATOL)


def test_cached_step_compiles_with_a_tensor_index():
    x = _inputs(2)
    layer = _layer(x)
    full = layer(x).numpy()

    @tf.function(jit_compile=True)
    def step(token, cache, index):
        return layer(token, cache=cache, cache_update_index=index)

    cache = _empty_cache()
    for index in range(LENGTH):
        output, cache = step(x[:, index : index + 1], cache, tf.constant(index))
        np.testing.assert_allclose(output, full[:, index : index + 1], atol=ATOL)


def test_cached_decoding_with_a_padding_mask_over_the_cache():
    x = _inputs(3)
    layer = _layer(x)
    padding = np.arange(LENGTH)[None, :] < np.array([[LENGTH], [4]])
    full = layer(x, query_mask=padding, value_mask=padding).numpy()
    cache = _empty_cache()
    for index in range(LENGTH):
        output, cache = layer(
            x[:, index : index + 1], query_mask=padding, value_mask=padding, cache=cache, cache_update_index=index
        )
        real = padding[:, index]
        np.testing.assert_allclose(output.numpy()[real], full[real, index : index + 1], atol=ATOL)
        # The mask covers the cache, not this step: it must not be attached to the output.
        assert getattr(output, "_keras_mask", None) is None


def test_serialization_round_trip():
    def build():
        inputs = keras.Input((None, FEATURES))
        return keras.Model(inputs, CausalSelfAttention(**CONFIG, sliding_window=4)(inputs))

    reloaded = assert_serialization_round_trip(build, _inputs(4))
    layer = reloaded.layers[-1]
    assert type(layer) is CausalSelfAttention and layer.sliding_window == 4


def test_layer_contract():
    rng = np.random.default_rng(12)
    run_layer_test(
        CausalSelfAttention,
        dict(num_heads=2, key_dim=4, num_key_value_heads=1, sliding_window=3),
        rng.standard_normal((2, 6, 8)).astype("float32"),
        expected_num_trainable_weights=8,
        unchanged_ok=("key/bias",),
    )
