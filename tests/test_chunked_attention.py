"""Chunked attention against the NumPy float64 reference and the dense path, values and gradients.

Chunks of 4 queries over lengths that are not multiples of 4, so every test runs several chunks,
a short last chunk and, under causal/window masks, chunks that skip keys (or see none at all).
The written-out gradient is checked against autodiff through the dense path, in float64.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.core import masks
from keras_attn.core import softmax
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import single_query
from keras_attn.kernels.chunked import QUERY_CHUNK_SIZE
from keras_attn.kernels.chunked import chunk_tiles
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.kernels.chunked import pattern_query_chunks
from keras_attn.kernels.document_blocks import may_share_document
from keras_attn.patterns import from_shorthands
from tests import reference
from tests.layer_checks import output_gradients

CHUNK = 4
BATCH, QUERY_LEN, KEY_LEN, HEADS, DEPTH, VALUE_DEPTH = 2, 11, 11, 3, 5, 4
FLOAT32_ATOL = 1e-5


def _inputs(rng, dtype="float64", key_len=KEY_LEN, value_depth=VALUE_DEPTH):
    shapes = ((BATCH, QUERY_LEN, HEADS, DEPTH), (BATCH, key_len, HEADS, DEPTH), (BATCH, key_len, HEADS, value_depth))
    return [tf.constant(rng.normal(size=shape), dtype) for shape in shapes]


def _empty_rows_mask(rng, shape):
    mask = rng.random(shape) < 0.7
    if shape[2] == 1:
        mask[0] = False  # padding only: the first sequence has no keys at all
    else:
        mask[0, ..., 1, :] = False  # a query row that sees no key
    return mask


CASES = {
    "causal": dict(is_causal=True),
    "causal_window": dict(is_causal=True, sliding_window=3),
    "window": dict(sliding_window=2),
    "causal_offset_longer_keys": dict(is_causal=True, query_offset=6, key_len=17),
    "window_offset_chunks_without_keys": dict(sliding_window=2, query_offset=9, key_len=10),
    "full_bias_and_mask": dict(
        is_causal=True, bias=(1, HEADS, QUERY_LEN, KEY_LEN), mask=(BATCH, 1, QUERY_LEN, KEY_LEN)
    ),
    "key_bias_window": dict(is_causal=True, sliding_window=3, bias=(BATCH, 1, 1, KEY_LEN)),
    "query_bias_and_padding": dict(sliding_window=4, bias=(BATCH, HEADS, QUERY_LEN, 1), mask=(BATCH, 1, 1, KEY_LEN)),
    "no_pattern": dict(),
    "no_pattern_bias_and_padding": dict(bias=(1, HEADS, QUERY_LEN, KEY_LEN), mask=(BATCH, 1, 1, KEY_LEN)),
    "no_pattern_longer_keys": dict(key_len=17),
}


def _case(name, rng):
    case = dict(CASES[name])
    key_len = case.pop("key_len", KEY_LEN)
    if "bias" in case:
        shape = case["bias"][:3] + ((key_len,) if case["bias"][3] != 1 else (1,))
        case["bias"] = tf.constant(rng.normal(size=shape))
    if "mask" in case:
        shape = case["mask"][:3] + (key_len,)
        case["mask"] = _empty_rows_mask(rng, shape)
    return key_len, case


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_the_dense_path(name):
    rng = np.random.default_rng(1)
    key_len, case = _case(name, rng)
    bias = case.pop("bias", None)
    inputs = _inputs(rng, key_len=key_len) + ([] if bias is None else [bias])
    output_grad = tf.constant(rng.normal(size=(BATCH, QUERY_LEN, HEADS, VALUE_DEPTH)))

    def chunked(query, key, value, bias=None):
        return chunked_attention(query, key, value, bias=bias, scale=0.4, chunk_size=CHUNK, **case)

    def dense(query, key, value, bias=None):
        return scaled_dot_product_attention(query, key, value, bias=bias, scale=0.4, implementation="dense", **case)

    np.testing.assert_allclose(chunked(*inputs), dense(*inputs), atol=1e-12, rtol=0)
    for got, want in zip(output_gradients(chunked, inputs, output_grad), output_gradients(dense, inputs, output_grad)):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def test_rows_without_keys_give_zero_output_and_zero_gradients():
    rng = np.random.default_rng(2)
    query, key, value = _inputs(rng)
    mask = _empty_rows_mask(rng, (BATCH, 1, QUERY_LEN, KEY_LEN))
    output_grad = tf.ones((BATCH, QUERY_LEN, HEADS, VALUE_DEPTH), "float64")

    def attend(query, key, value):
        return chunked_attention(query, key, value, mask=mask, is_causal=True, chunk_size=CHUNK)

    output = attend(query, key, value).numpy()
    query_grad, _, _ = output_gradients(attend, [query, key, value], output_grad)
    assert np.all(output[0, 1] == 0.0) and np.all(query_grad[0, 1] == 0.0)
    assert np.all(np.isfinite(query_grad)) and np.any(output[1] != 0.0)


def _dropped_weights(seed, rate, query, key):
    """The dropped-out weights `(batch, heads, q, k)`: attend to one-hot values, one per key."""
    one_hot = np.broadcast_to(np.eye(KEY_LEN)[None, :, None, :], (BATCH, KEY_LEN, HEADS, KEY_LEN))
    output = chunked_attention(
        query,
        key,
        tf.constant(one_hot),
        is_causal=True,
        scale=DEPTH**-0.5,
        dropout_rate=rate,
        seed_generator=keras.random.SeedGenerator(seed),
        chunk_size=CHUNK,
    )  # (batch, q, heads, k)
    return np.transpose(output.numpy(), (0, 2, 1, 3))


def test_dropout_drops_normalised_weights_and_the_gradient_uses_the_forward_masks():
    rng = np.random.default_rng(3)
    query, key, value = _inputs(rng, value_depth=KEY_LEN)
    rate, seed = 0.3, 11
    _, weights = reference.attention(query.numpy(), key.numpy(), value.numpy(), is_causal=True)
    dropped = _dropped_weights(seed, rate, query, key)
    keep = dropped != 0.0
    np.testing.assert_allclose(dropped[keep], weights[keep] / (1.0 - rate), atol=1e-12)
    assert abs((1.0 - keep[weights > 0].mean()) - rate) < 0.1
    output_grad = tf.constant(rng.normal(size=(BATCH, QUERY_LEN, HEADS, KEY_LEN)))

    def chunked(query, key, value):
        return chunked_attention(
            query,
            key,
            value,
            is_causal=True,
            scale=DEPTH**-0.5,
            dropout_rate=rate,
            seed_generator=keras.random.SeedGenerator(seed),
            chunk_size=CHUNK,
        )

    def dense_with_the_same_masks(query, key, value):
        logits = softmax.attention_logits(query, key) * DEPTH**-0.5
        weights = softmax.masked_softmax(logits, masks.causal_mask(QUERY_LEN, KEY_LEN)) * keep / (1.0 - rate)
        return tf.einsum("bhqk,bkhd->bqhd", weights, value)

    inputs = [query, key, value]
    got_grads, want_grads = (
        output_gradients(chunked, inputs, output_grad),
        output_gradients(dense_with_the_same_masks, inputs, output_grad),
    )
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("dtype, atol", [("float32", FLOAT32_ATOL), ("float16", 2e-3), ("bfloat16", 2e-2)])
def test_other_dtypes_keep_their_dtype_and_match_the_float64_gradients(dtype, atol):
    rng = np.random.default_rng(4)
    inputs64 = _inputs(rng)
    inputs = [tf.cast(x, dtype) for x in inputs64]
    output_grad = tf.constant(rng.normal(size=(BATCH, QUERY_LEN, HEADS, VALUE_DEPTH)), "float32")

    def attend(query, key, value):
        return chunked_attention(query, key, value, is_causal=True, sliding_window=5, chunk_size=CHUNK)

    assert attend(*inputs).dtype == dtype
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = tf.reduce_sum(tf.cast(attend(*inputs), "float32") * output_grad)
    grads = tape.gradient(loss, inputs)
    assert all(grad.dtype == dtype for grad in grads)
    exact = output_gradients(attend, [tf.cast(x, "float64") for x in inputs], tf.cast(output_grad, "float64"))
    for got, want in zip(grads, exact):
        np.testing.assert_allclose(tf.cast(got, "float64"), want, atol=atol * max(1.0, np.abs(want).max()))


def test_compiled_gradients_equal_the_eager_ones():
    rng = np.random.default_rng(5)
    inputs = [tf.cast(x, "float32") for x in _inputs(rng)]
    bias = tf.constant(rng.normal(size=(1, HEADS, QUERY_LEN, KEY_LEN)), "float32")
    output_grad = tf.constant(rng.normal(size=(BATCH, QUERY_LEN, HEADS, VALUE_DEPTH)), "float32")

    def attend(query, key, value, bias):
        return chunked_attention(query, key, value, bias=bias, is_causal=True, sliding_window=6, chunk_size=CHUNK)

    def gradients(query, key, value, bias):
        with tf.GradientTape() as tape:
            tape.watch([query, key, value, bias])
            loss = tf.reduce_sum(attend(query, key, value, bias) * output_grad)
        return tape.gradient(loss, [query, key, value, bias])

    eager = gradients(*inputs, bias)
    compiled = tf.function(gradients, jit_compile=True)(*inputs, bias)
    for got, want in zip(compiled, eager):
        np.testing.assert_allclose(got, want, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("is_causal, sliding_window", [(True, None), (True, 3), (False, 3), (False, None)])
@pytest.mark.parametrize("query_len, key_len, query_offset", [(9, 9, 0), (4, 9, 5), (9, 5, 0), (3, 4, 6)])
def test_pattern_query_chunks_cover_exactly_the_band(is_causal, sliding_window, query_len, key_len, query_offset):
    band = np.ones((query_len, key_len), bool)
    rows = np.arange(query_len)[:, None] + query_offset
    cols = np.arange(key_len)[None, :]
    if is_causal:
        band &= cols <= rows
    if sliding_window is not None:
        band &= np.abs(rows - cols) < sliding_window
    covered = np.zeros_like(band)
    next_query = 0
    pattern = from_shorthands(None, is_causal, sliding_window)
    for chunk in pattern_query_chunks(query_len, key_len, 2, pattern, query_offset):
        assert chunk.query_start == next_query and 0 <= chunk.key_start <= chunk.key_stop <= key_len
        next_query = chunk.query_stop
        covered[chunk.query_start : chunk.query_stop, chunk.key_start : chunk.key_stop] = True
    assert next_query == query_len
    assert np.all(covered[band])  # every key a query may attend to is in its chunk
    assert covered.sum() < band.size or band.all()  # and the chunks skip part of the masked area


# Packed rows: documents of 6, 5 and 4 tokens and padding, in chunks of 4 queries over tiles of 4 keys.
PACKED_IDS = np.array([[1] * 6 + [2] * 5 + [3] * 4 + [0] * 3, [1] * 3 + [2] * 9 + [3] * 2 + [0] * 4], "int32")
PACKED_LEN = PACKED_IDS.shape[1]


def _document_mask(query_ids, key_ids):
    """NumPy `(batch, 1, q, k)`: same non-zero document."""
    return ((query_ids[:, :, None] == key_ids[:, None, :]) & (query_ids[:, :, None] != 0))[:, None]


def _packed_inputs(rng, batch=BATCH, length=PACKED_LEN, dtype="float64"):
    shapes = ((batch, length, HEADS, DEPTH), (batch, length, HEADS, DEPTH), (batch, length, HEADS, VALUE_DEPTH))
    return [rng.normal(size=shape).astype(dtype) for shape in shapes]


PACKED_CASES = {
    "causal": dict(is_causal=True),
    "window": dict(sliding_window=3),
    "no_pattern_bias": dict(bias=(1, HEADS, PACKED_LEN, PACKED_LEN)),
    "causal_key_bias_and_mask": dict(is_causal=True, bias=(BATCH, 1, 1, PACKED_LEN), mask=(BATCH, 1, 1, PACKED_LEN)),
    "large_scale": dict(is_causal=True, scale=3.0),  # not folded into the query: shifted, then scaled
}


@pytest.mark.parametrize("name", sorted(PACKED_CASES))
def test_packed_rows_match_the_float64_reference_of_each_document(name):
    rng = np.random.default_rng(6)
    case = dict(PACKED_CASES[name])
    scale = case.pop("scale", 0.4)
    query, key, value = _packed_inputs(rng)
    bias = None if "bias" not in case else rng.normal(size=case.pop("bias"))
    mask = None if "mask" not in case else rng.random(case.pop("mask")) < 0.8
    allowed = _document_mask(PACKED_IDS, PACKED_IDS) & (True if mask is None else mask)
    expected, _ = reference.attention(query, key, value, mask=allowed, bias=bias, scale=scale, **case)
    output_grad = rng.normal(size=expected.shape)

    def attend(query, key, value, bias=None):
        return chunked_attention(
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            scale=scale,
            chunk_size=CHUNK,
            key_block_size=CHUNK,
            query_segment_ids=PACKED_IDS,
            key_segment_ids=PACKED_IDS,
            **case,
        )

    inputs = [tf.constant(t) for t in (query, key, value)] + ([] if bias is None else [tf.constant(bias)])
    np.testing.assert_allclose(attend(*inputs), expected, atol=1e-12, rtol=0)
    causal = case.get("is_causal", False)
    wants = reference.attention_gradients(
        query, key, value, output_grad, mask=_window(allowed, case), bias=bias, is_causal=causal, scale=scale
    )
    wants = list(wants[:3]) + ([] if bias is None else [_reduced_like(wants[3], bias)])
    for got, want in zip(output_gradients(attend, inputs, tf.constant(output_grad)), wants):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def _window(allowed, case):
    """`allowed` with the case's sliding window (the reference's gradients take no window)."""
    if "sliding_window" not in case:
        return allowed
    rows, cols = np.arange(allowed.shape[2])[:, None], np.arange(allowed.shape[3])[None, :]
    return allowed & (np.abs(rows - cols) < case["sliding_window"])


def _reduced_like(gradient, bias):
    """A `(batch, heads, q, k)` gradient summed over the axes `bias` broadcasts."""
    axes = tuple(axis for axis in range(4) if bias.shape[axis] == 1)
    return gradient.sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("is_causal", [False, True])
def test_packed_tiles_without_a_shared_document_are_never_computed(is_causal):
    # Documents of 6, 6 and 6 tokens and 2 of padding, the same in both rows; chunks of 4 queries,
    # tiles of 4 keys. The queries of documents 1 and 2 (0..11) share no document with the tiles
    # [12, 16) and [16, 20) (document 3 and padding): NaN there reaches their outputs and gradients
    # only if such a tile is computed (0 weight times NaN is NaN), as the dense path over the row shows.
    ids = np.array([[1] * 6 + [2] * 6 + [3] * 6 + [0] * 2] * BATCH, "int32")
    rng = np.random.default_rng(7)
    query, key, value = _packed_inputs(rng, length=20)
    poisoned_key, poisoned_value = key.copy(), value.copy()
    poisoned_key[:, 12:], poisoned_value[:, 12:] = np.nan, np.nan
    allowed = _document_mask(ids, ids)
    expected, _ = reference.attention(query, key, value, mask=allowed, is_causal=is_causal, scale=0.5)
    output_grad = rng.normal(size=expected.shape)
    kept = slice(0, 12)

    tiles = dict(chunk_size=4, key_block_size=4)

    def attend(query, key, value):
        return chunked_attention(
            query, key, value, is_causal=is_causal, scale=0.5, query_segment_ids=ids, key_segment_ids=ids, **tiles
        )

    dense = scaled_dot_product_attention(
        query, poisoned_key, poisoned_value, mask=allowed, is_causal=is_causal, scale=0.5, implementation="dense"
    )
    assert np.isnan(np.asarray(dense)[:, kept]).any()  # the poison reaches what computes the tiles
    poisoned = [tf.constant(t) for t in (query, poisoned_key, poisoned_value)]
    np.testing.assert_allclose(np.asarray(attend(*poisoned))[:, kept], expected[:, kept], atol=1e-12)
    wants = reference.attention_gradients(query, key, value, output_grad, mask=allowed, is_causal=is_causal, scale=0.5)
    for got, want in zip(output_gradients(attend, poisoned, tf.constant(output_grad)), wants):
        np.testing.assert_allclose(got[:, kept], want[:, kept], atol=1e-12)


def _computed_tiles(ids, chunk_size, pattern=None):
    """Per tile of self-attention over packed `ids`: (computed by the plan, has a same-document pair)."""
    allowed = _document_mask(ids, ids)[:, 0]  # (batch, length, length)
    tiles = [
        tile
        for chunk in pattern_query_chunks(ids.shape[1], ids.shape[1], chunk_size, pattern)
        for tile in chunk_tiles(chunk, chunk_size)
    ]
    return [
        (
            bool(
                may_share_document(ids[:, tile.query_start : tile.query_stop], ids[:, tile.key_start : tile.key_stop])
            ),
            bool(allowed[:, tile.query_start : tile.query_stop, tile.key_start : tile.key_stop].any()),
        )
        for tile in tiles
    ]


@pytest.mark.parametrize("document_len, chunk_size", [(16, 16), (16, 8), (15, 16), (13, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_the_plan_computes_exactly_the_tiles_holding_a_document_pair(document_len, chunk_size, is_causal):
    ids = np.repeat(np.arange(1, 9, dtype="int32"), document_len)[None]  # a row of 8 documents
    tiles = _computed_tiles(ids, chunk_size, from_shorthands(None, is_causal, None))
    assert all(computed == needed for computed, needed in tiles)
    if document_len % chunk_size == 0:  # aligned: each document's own (document_len / chunk_size)^2 tiles
        per_document = (document_len // chunk_size) ** 2
        if is_causal:
            per_document = (per_document + document_len // chunk_size) // 2
        assert sum(computed for computed, _ in tiles) == 8 * per_document


def test_padding_queries_give_exact_zeros_and_the_dtypes_and_xla_agree():
    rng = np.random.default_rng(8)
    inputs = [tf.constant(t, "float32") for t in _packed_inputs(rng, dtype="float32")]
    allowed = _document_mask(PACKED_IDS, PACKED_IDS)
    expected, _ = reference.attention(*inputs, mask=allowed, is_causal=True, scale=0.4)
    output_grad = tf.constant(rng.normal(size=expected.shape), "float32")

    def attend(query, key, value):
        return scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=0.4, segment_ids=PACKED_IDS, implementation="chunked"
        )

    def gradients(query, key, value):
        with tf.GradientTape() as tape:
            tape.watch([query, key, value])
            loss = tf.reduce_sum(attend(query, key, value) * output_grad)
        return [attend(query, key, value)] + tape.gradient(loss, [query, key, value])

    eager = gradients(*inputs)
    padding = PACKED_IDS == 0
    assert np.all(eager[0].numpy()[padding] == 0.0) and np.all(eager[1].numpy()[padding] == 0.0)
    np.testing.assert_allclose(eager[0], expected, atol=FLOAT32_ATOL)
    for jit_compile in (False, True):
        compiled = tf.function(gradients, jit_compile=jit_compile)(*inputs)
        for got, want in zip(compiled, eager):
            np.testing.assert_allclose(got, want, atol=FLOAT32_ATOL)
    half = attend(*(tf.cast(t, "float16") for t in inputs))
    assert half.dtype == "float16" and np.all(half.numpy()[padding] == 0.0)
    np.testing.assert_allclose(tf.cast(half, "float32"), expected, atol=2e-3)


def test_cached_decoding_steps_see_only_their_documents_keys_in_the_cache():
    # A packed prompt of documents 1 and 2 in the cache; the new tokens continue document 2, and the
    # last is padding. The dense path's one-query route and the chunked kernel at an offset agree
    # with the reference over the cache's keys of the queries' own documents.
    rng = np.random.default_rng(9)
    cache_ids = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0]] * BATCH, "int32")
    cache_ids[1, 2:9] = 2
    query, key, value = _packed_inputs(rng, length=12)
    for offset, query_ids in ((9, np.array([[2], [2]], "int32")), (9, np.array([[2, 2, 0], [2, 1, 2]], "int32"))):
        steps = query_ids.shape[1]
        key_ids = cache_ids.copy()
        key_ids[:, offset : offset + steps] = query_ids
        allowed = _document_mask(query_ids, key_ids)
        allowed &= (np.arange(12)[None, :] <= np.arange(steps)[:, None] + offset)[None, None]
        queries = query[:, :steps]
        expected, _ = reference.attention(queries, key, value, mask=allowed, scale=0.4)
        documents = dict(query_segment_ids=query_ids, key_segment_ids=key_ids)
        for implementation in ("dense", "chunked"):
            output = scaled_dot_product_attention(
                queries,
                key,
                value,
                is_causal=True,
                query_offset=offset,
                scale=0.4,
                implementation=implementation,
                **documents,
            )
            np.testing.assert_allclose(output, expected, atol=1e-12, err_msg=f"{implementation}, {steps} steps")
        # One query of one row outside XLA: the dense path takes its single-query route (no transposes).
        row = {name: ids[1:] for name, ids in documents.items()}
        assert single_query.applies(tf.constant(queries[1:]), tf.constant(key[1:])) == (steps == 1)
        output = scaled_dot_product_attention(
            queries[1:], key[1:], value[1:], is_causal=True, query_offset=offset, scale=0.4, **row
        )
        np.testing.assert_allclose(output, expected[1:], atol=1e-12, err_msg=f"one row, {steps} steps")


def test_packed_dropout_drops_the_row_softmax_and_the_gradient_uses_the_forward_masks():
    rng = np.random.default_rng(10)
    query, key, _ = _packed_inputs(rng)
    allowed = _document_mask(PACKED_IDS, PACKED_IDS)
    rate, seed = 0.3, 12

    def attend(query, key, value):
        return chunked_attention(
            query,
            key,
            value,
            is_causal=True,
            scale=0.4,
            dropout_rate=rate,
            seed_generator=keras.random.SeedGenerator(seed),
            chunk_size=CHUNK,
            key_block_size=CHUNK,
            query_segment_ids=PACKED_IDS,
            key_segment_ids=PACKED_IDS,
        )

    one_hot = np.broadcast_to(np.eye(PACKED_LEN)[None, :, None, :], (BATCH, PACKED_LEN, HEADS, PACKED_LEN))
    dropped = np.transpose(attend(query, key, tf.constant(one_hot)).numpy(), (0, 2, 1, 3))  # (b, h, q, k)
    _, weights = reference.attention(query, key, one_hot, mask=allowed, is_causal=True, scale=0.4)
    keep = dropped != 0.0
    np.testing.assert_allclose(dropped[keep], weights[keep] / (1.0 - rate), atol=1e-12)
    assert not np.any(keep & (weights == 0.0)) and 0.1 < 1.0 - keep[weights > 0].mean() < 0.5

    def dense_with_the_same_masks(query, key, value):
        logits = softmax.attention_logits(query, key) * 0.4
        causal = masks.causal_mask(PACKED_LEN, PACKED_LEN)
        weights = softmax.masked_softmax(logits, causal & allowed) * keep / (1.0 - rate)
        return tf.einsum("bhqk,bkhd->bqhd", weights, value)

    inputs = [tf.constant(t) for t in (query, key, one_hot)]
    output_grad = tf.constant(rng.normal(size=one_hot.shape))
    for got, want in zip(
        output_gradients(attend, inputs, output_grad), output_gradients(dense_with_the_same_masks, inputs, output_grad)
    ):
        np.testing.assert_allclose(got, want, atol=1e-12)


# A causal training step at 4,096 tokens, run in a process whose CPU allocator keeps statistics
# (`TF_CPU_ALLOCATOR_USE_BFC` is read when TensorFlow starts): its peak over what was held before.
_TRAINING_PEAK_SCRIPT = textwrap.dedent(
    """
    import sys

    import tensorflow as tf
    from keras_attn.kernels.chunked import chunked_attention

    q, k, v = (tf.random.stateless_normal((1, 4096, 8, 8), seed=(i, 0)) for i in range(3))
    mask = tf.ones((1, 1, 4096, 4096), bool) if sys.argv[1] == "mask" else None

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch((q, k, v))
            loss = tf.reduce_sum(chunked_attention(q, k, v, mask=mask, is_causal=True) ** 2)
        return tape.gradient(loss, (q, k, v))

    step.get_concrete_function()
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    [gradient.numpy() for gradient in step()]
    print(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    """
)


@pytest.mark.parametrize("mask", ["no mask", "mask"])
def test_a_training_step_holds_far_less_than_every_chunks_weights(mask):
    # The backward pass recomputes each chunk's weights: keeping them all from the forward pass
    # would hold the whole causal triangle of float32 weights, more than the step's peak. With a
    # mask of the caller's (KerasHub's decoders hand one), each chunk's masked weights once selected
    # from a zeros tensor as large as them, allocated apart from the chunks' order: all at once.
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", _TRAINING_PEAK_SCRIPT, mask], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1])
    chunks = pattern_query_chunks(4096, 4096, QUERY_CHUNK_SIZE, from_shorthands(None, True, None))
    every_chunks_weights = sum(
        (chunk.query_stop - chunk.query_start) * (chunk.key_stop - chunk.key_start) * 8 * 4 for chunk in chunks
    )
    assert 0 < peak < every_chunks_weights / 2
