"""CrossAttention against MultiHeadAttention(query, context) with the same weights."""

import keras
import numpy as np
import pytest

from keras_attn.layers.cross_attention import CrossAttention
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import run_layer_test

CONFIG = dict(num_heads=4, key_dim=3, num_key_value_heads=2, bias_initializer="random_normal")
BATCH, QUERY_LEN, CONTEXT_LEN, QUERY_DIM, CONTEXT_DIM = 2, 5, 7, 8, 6
ATOL = 1e-5


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((BATCH, QUERY_LEN, QUERY_DIM)).astype("float32")
    context = rng.standard_normal((BATCH, CONTEXT_LEN, CONTEXT_DIM)).astype("float32")
    query_mask = np.arange(QUERY_LEN)[None, :] < np.array([[QUERY_LEN], [3]])
    context_mask = np.arange(CONTEXT_LEN)[None, :] < np.array([[CONTEXT_LEN - 1], [2]])
    return query, context, query_mask, context_mask


def _layer(query, context, **config):
    layer = CrossAttention(**CONFIG, **config)
    layer(query, context)
    return layer


@pytest.mark.parametrize("config", [{}, dict(value_dim=5, output_shape=4, use_gate=True)], ids=["default", "wide"])
def test_equals_multi_head_attention(config):
    query, context, query_mask, context_mask = _inputs()
    layer = _layer(query, context, **config)
    reference = MultiHeadAttention(**CONFIG, **config)
    reference(query, context)
    reference.set_weights(layer.get_weights())
    attention_mask = np.random.default_rng(1).random((BATCH, QUERY_LEN, CONTEXT_LEN)) < 0.8
    output, scores = layer(
        query,
        context,
        query_mask=query_mask,
        value_mask=context_mask,
        attention_mask=attention_mask,
        return_attention_scores=True,
    )
    expected, expected_scores = reference(
        query,
        context,
        query_mask=query_mask,
        value_mask=context_mask,
        attention_mask=attention_mask,
        return_attention_scores=True,
    )
    assert output.shape == (BATCH, QUERY_LEN, config.get("output_shape", QUERY_DIM))
    np.testing.assert_allclose(output, expected, atol=ATOL)
    np.testing.assert_allclose(scores, expected_scores, atol=ATOL)
    assert np.all(scores.numpy()[1, :, :, 2:] == 0)


def _token_model():
    """Decoder tokens attend to encoder tokens; both padded with 0, masks from the embeddings."""
    target = keras.Input((None,), dtype="int32")
    source = keras.Input((None,), dtype="int32")
    query = keras.layers.Embedding(20, QUERY_DIM, mask_zero=True)(target)
    context = keras.layers.Embedding(20, CONTEXT_DIM, mask_zero=True)(source)
    return keras.Model([target, source], CrossAttention(**CONFIG)(query, context))


TARGET = np.array([[4, 2, 9, 0, 0], [3, 1, 5, 6, 7]], "int32")
SOURCE = np.array([[8, 3, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 0]], "int32")


def test_keras_masks_of_both_inputs_are_used_and_the_query_mask_propagates():
    model = _token_model()
    query_embedding, context_embedding, layer = model.layers[2], model.layers[3], model.layers[4]
    query, context = query_embedding(TARGET), context_embedding(SOURCE)
    output = layer(query, context)
    np.testing.assert_array_equal(output._keras_mask, TARGET != 0)
    explicit = layer(keras.ops.copy(query), keras.ops.copy(context), query_mask=TARGET != 0, value_mask=SOURCE != 0)
    np.testing.assert_allclose(output, explicit, atol=ATOL)
    np.testing.assert_allclose(model([TARGET, SOURCE]), explicit, atol=ATOL)


def test_precomputed_context_cache_equals_the_plain_call():
    query, context, query_mask, context_mask = _inputs(2)
    layer = _layer(query, context)
    expected = layer(query, context, query_mask=query_mask, value_mask=context_mask)
    cache = keras.ops.stack([layer.key_dense(context), layer.value_dense(context)], axis=1)
    for step in range(QUERY_LEN):
        output, returned_cache = layer(
            query[:, step : step + 1],
            context,
            query_mask=query_mask[:, step : step + 1],
            value_mask=context_mask,
            cache=cache,
        )
        np.testing.assert_allclose(output, expected.numpy()[:, step : step + 1], atol=ATOL)
        np.testing.assert_array_equal(returned_cache, cache)


def test_serialization_round_trip():
    reloaded = assert_serialization_round_trip(_token_model, [TARGET, SOURCE])
    assert type(reloaded.layers[-1]) is CrossAttention


def test_layer_contract():
    rng = np.random.default_rng(13)
    inputs = (rng.standard_normal((2, 5, 8)).astype("float32"), rng.standard_normal((2, 4, 6)).astype("float32"))
    run_layer_test(
        CrossAttention,
        dict(num_heads=2, key_dim=4),
        inputs,
        expected_num_trainable_weights=8,
        unchanged_ok=("key/bias",),
    )
