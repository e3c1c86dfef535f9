"""The decoding step's own ops outside XLA against independent oracles, and XLA keeping the einsums.

A cached step of one token takes other ops than a full pass where TensorFlow's op-by-op runtime
runs them faster: the block-diagonal products of one query
(`keras_attn.kernels.single_query`), the cache write as a scatter (`key_value_cache.written`) and
three unfused projections. Their oracles: NumPy float64 einsums, softmax and assignment, and the
layer's full causal pass (cached = recomputed to 1e-5) at batch 1 and 3, eagerly, in a graph, in a
graph `while` loop carrying the cache (where the write is in place) and under XLA.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.kernels import single_query
from keras_attn.layers.key_value_cache import written
from keras_attn.layers.multi_head_attention import MultiHeadAttention

LENGTH, FEATURES = 7, 12
ATOL = 1e-5


def _normal(rng, *shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def _run(function, mode, *args):
    """`function(*args)` eagerly, in a `tf.function` graph or compiled by XLA."""
    if mode == "eager":
        return function(*args)
    return tf.function(function, jit_compile=mode == "xla")(*args)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch, heads", [(1, 1), (1, 4), (3, 4)])
def test_single_query_products_equal_numpy_einsums_and_softmax(batch, heads, dtype, mode):
    rng = np.random.default_rng(0)
    query, key = _normal(rng, batch, 1, heads, 5, dtype=dtype), _normal(rng, batch, LENGTH, heads, 5, dtype=dtype)
    value = _normal(rng, batch, LENGTH, heads, 3, dtype=dtype)
    logits = np.einsum("bqhd,bkhd->bhqk", query.astype(np.float64), key.astype(np.float64))
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", weights, value.astype(np.float64))

    def products(query, key, value):
        computed = single_query.softmax(single_query.logits(query, key))
        return computed, single_query.values(tf.cast(computed, value.dtype), value)

    computed_weights, output = _run(products, mode, query, key, value)
    tolerance = 1e-12 if dtype == "float64" else ATOL
    np.testing.assert_allclose(computed_weights, weights, atol=tolerance)
    np.testing.assert_allclose(output, expected, atol=tolerance)


def test_the_single_query_products_serve_one_query_of_one_row_outside_xla_only():
    one, two = tf.zeros((1, 1, 4, 3)), tf.zeros((1, 2, 4, 3))
    keys = tf.zeros((1, LENGTH, 4, 3))
    traced = {}

    def trace(mode):
        def record(query, key):
            traced[mode] = single_query.applies(query, key)  # decided when the graph is traced
            return query

        return record

    for mode in ("graph", "xla"):
        _run(trace(mode), mode, one, keys)
    assert single_query.applies(one, keys) and traced == {"graph": True, "xla": False}
    assert not single_query.applies(two, keys)  # more queries: the einsums
    assert not single_query.applies(tf.zeros((2, 1, 4, 3)), tf.zeros((2, LENGTH, 4, 3)))  # more rows: the einsums
    many_heads = single_query.MAX_HEADS + 1
    assert not single_query.applies(tf.zeros((1, 1, many_heads, 3)), tf.zeros((1, LENGTH, many_heads, 3)))


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize("new_len, index", [(1, 0), (1, LENGTH - 1), (3, 2)])
def test_the_cache_write_equals_numpy_assignment(new_len, index, mode):
    rng = np.random.default_rng(1)
    cache, new = _normal(rng, 3, 2, LENGTH, 2, 4), _normal(rng, 3, 2, new_len, 2, 4)
    expected = cache.copy()
    expected[:, :, index : index + new_len] = new
    result = _run(written, mode, tf.constant(cache), tf.constant(new), tf.constant(index))
    np.testing.assert_array_equal(result, expected)


def _layer(rng, **config):
    layer = MultiHeadAttention(num_heads=4, key_dim=3, bias_initializer="random_normal", **config)
    layer.build((None, None, FEATURES))
    layer.set_weights([0.3 * _normal(rng, *w.shape) for w in layer.get_weights()])  # outputs of order 1
    return layer


def _decode_in_a_loop(layer, x, cache):
    """Every position of `x` through the cached layer in one graph `while` loop carrying the cache (the
    state a generation loop carries, which TensorFlow's runtime may write in place)."""
    outputs = tf.TensorArray(x.dtype, size=x.shape[1])
    for index in tf.range(x.shape[1]):
        token = tf.expand_dims(x[:, index], 1)
        output, cache = layer(token, token, use_causal_mask=True, cache=cache, cache_update_index=index)
        outputs = outputs.write(index, output[:, 0])
    return tf.transpose(outputs.stack(), (1, 0, 2))


@pytest.mark.parametrize("mode", ["eager", "graph", "loop", "xla"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("config", [{}, {"num_key_value_heads": 2}, {"use_bias": False}], ids=["mha", "gqa", "no_bias"])
def test_token_by_token_decoding_equals_the_full_causal_pass(config, batch, mode):
    rng = np.random.default_rng(2)
    layer = _layer(rng, **config)
    x = tf.constant(_normal(rng, batch, LENGTH, FEATURES))
    full = layer(x, x, use_causal_mask=True)
    cache = layer.initial_cache(batch, LENGTH)
    if mode == "loop":
        cached = tf.function(_decode_in_a_loop)(layer, x, cache)
    else:
        step = layer if mode == "eager" else tf.function(layer, jit_compile=mode == "xla")
        outputs = []
        for index in range(LENGTH):
            token = x[:, index : index + 1]
            output, cache = step(token, token, use_causal_mask=True, cache=cache, cache_update_index=tf.constant(index))
            outputs.append(output)
        cached = tf.concat(outputs, axis=1)
    np.testing.assert_allclose(cached, full, atol=ATOL)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_padded_cache_step_equals_the_padded_full_pass(batch):
    """Padding masks over the cache reach the single-query path: masked keys get no weight."""
    rng = np.random.default_rng(3)
    layer = _layer(rng)
    x = tf.constant(_normal(rng, batch, LENGTH, FEATURES))
    padding = np.ones((batch, LENGTH), bool)
    padding[:, 1] = False  # an earlier key every later token must ignore
    full = layer(x, x, use_causal_mask=True, value_mask=padding)
    cache = layer.initial_cache(batch, LENGTH)
    step = tf.function(layer)
    for index in range(LENGTH):
        token = x[:, index : index + 1]
        output, cache = step(
            token, token, use_causal_mask=True, value_mask=padding, cache=cache, cache_update_index=index
        )
        if index != 1:  # the masked position itself is a query without the mask
            np.testing.assert_allclose(output[:, 0], full[:, index], atol=ATOL)
