"""keras_attn.patterns against their NumPy definitions, and every kernel under every pattern.

Oracle: `reference.pattern_allowed` (the definitions in NumPy) and `reference.attention` (float64
attention under that mask); gradients against the float64 dense path given the NumPy mask.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import patterns
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels.blockwise import blockwise_attention
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import Causal
from keras_attn.patterns import GlobalTokens
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference

FLOAT32_ATOL = 2e-5
BATCH, HEADS, DEPTH = 2, 2, 4

PATTERNS = {
    "causal": (Causal(), ("causal",)),
    "window": (SlidingWindow(3), ("window", 3)),
    "strided": (Strided(3), ("strided", 3)),
    "block_local": (BlockLocal(4), ("block", 4)),
    "global": (GlobalTokens(2), ("global", 2)),
    "sparse_transformer": (
        Causal() & (SlidingWindow(3) | Strided(3)),
        ("and", ("causal",), ("or", ("window", 3), ("strided", 3))),
    ),
    "window_or_global": (SlidingWindow(2) | GlobalTokens(1), ("or", ("window", 2), ("global", 1))),
    "causal_block_local": (BlockLocal(4) & Causal(), ("and", ("block", 4), ("causal",))),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_mask_matches_the_definition(name):
    pattern, spec = PATTERNS[name]
    rows, cols = np.arange(5, 14), np.arange(0, 17)
    got = pattern.mask(tf.constant(rows), tf.constant(cols))
    np.testing.assert_array_equal(got, reference.pattern_allowed(spec, rows, cols))
    block = pattern.block_mask(4, 6, query_offset=3, key_offset=2)
    np.testing.assert_array_equal(block[0, 0], reference.pattern_allowed(spec, np.arange(3, 7), np.arange(2, 8)))


def test_strided_is_the_sparse_transformer_definition():
    rows, cols = np.arange(12)[:, None], np.arange(12)[None, :]
    np.testing.assert_array_equal(Strided(4).block_mask(12, 12)[0, 0], (rows - cols) % 4 == 0)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_ranges_are_conservative_and_full_blocks_are_full(name):
    pattern, spec = PATTERNS[name]
    key_len, positions = 20, 24
    allowed = reference.pattern_allowed(spec, np.arange(positions), np.arange(key_len))
    for first, size in itertools.product(range(positions), (1, 3, 5)):
        last = min(first + size, positions) - 1
        start, stop = pattern.key_range(first, last, key_len)
        assert isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= key_len
        reached = np.flatnonzero(allowed[first : last + 1].any(axis=0))
        assert np.all((reached >= start) & (reached < stop)), (first, last, start, stop)
        tensor_range = pattern.key_range(tf.constant(first), tf.constant(last), key_len)
        assert [int(bound) for bound in tensor_range] == [start, stop]
    for first, size in itertools.product(range(key_len), (1, 3, 5)):
        last = min(first + size, key_len) - 1
        start, stop = pattern.query_range(first, last, 2, positions)
        assert 2 <= start <= stop <= positions
        reaching = np.flatnonzero(allowed[:, first : last + 1].any(axis=1))
        reaching = reaching[reaching >= 2]
        assert np.all((reaching >= start) & (reaching < stop)), (first, last, start, stop)
    for first_row, first_col in itertools.product(range(0, positions, 3), range(0, key_len, 3)):
        if bool(pattern.block_full(first_row, first_row + 2, first_col, first_col + 2)):
            assert allowed[first_row : first_row + 3, first_col : first_col + 3].all()


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_strided_cover_holds_every_allowed_pair(name):
    pattern, spec = PATTERNS[name]
    band, stride = pattern.strided_cover()
    rows, cols = np.arange(24), np.arange(20)
    allowed = reference.pattern_allowed(spec, rows, cols)
    covered = np.zeros_like(allowed)
    if band is not None:
        covered |= np.asarray(band.mask(tf.constant(rows), tf.constant(cols)))
        for row in rows:  # the band reaches only keys inside its key_range
            start, stop = band.key_range(int(row), int(row), len(cols))
            assert not covered[row, :start].any() and not covered[row, stop:].any()
    if stride is not None:
        covered |= reference.pattern_allowed(("strided", stride), rows, cols)
    assert np.all(covered[allowed])
    assert (stride is not None) == (name in ("strided", "sparse_transformer"))


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_config_round_trip(name):
    pattern, _ = PATTERNS[name]
    config = keras.saving.serialize_keras_object(pattern)
    restored = patterns.get(config)
    assert restored is not pattern and restored.get_config() == pattern.get_config()
    assert repr(restored) == repr(pattern)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="window"):
        SlidingWindow(0)
    with pytest.raises(ValueError, match="stride"):
        Strided(2.5)
    with pytest.raises(TypeError, match="other"):
        Causal() & "causal"
    with pytest.raises(TypeError, match="pattern"):
        scaled_dot_product_attention(*_inputs(np.random.default_rng(0), 3, 3)[:3], pattern="causal")


def _inputs(rng, query_len, key_len):
    query = rng.standard_normal((BATCH, query_len, HEADS, DEPTH)).astype("float32")
    key = rng.standard_normal((BATCH, key_len, HEADS, DEPTH)).astype("float32")
    value = rng.standard_normal((BATCH, key_len, HEADS, DEPTH)).astype("float32")
    padding = (np.arange(key_len)[None, :] < np.array([key_len, key_len - 3])[:, None]).reshape(BATCH, 1, 1, key_len)
    bias = rng.standard_normal((1, HEADS, query_len, key_len)).astype("float32")
    return query, key, value, padding, bias


KERNELS = {
    "dense": lambda *args, **kwargs: scaled_dot_product_attention(*args, implementation="dense", **kwargs),
    "chunked": lambda *args, **kwargs: chunked_attention(*args, chunk_size=3, **kwargs),
    "blockwise": lambda *args, **kwargs: blockwise_attention(*args, query_block_size=4, key_block_size=3, **kwargs),
}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("query_len, key_len, query_offset", [(13, 13, 0), (5, 14, 9)])
def test_kernels_match_reference_values_and_gradients(kernel, name, query_len, key_len, query_offset):
    pattern, spec = PATTERNS[name]
    query, key, value, padding, bias = _inputs(np.random.default_rng(query_len), query_len, key_len)
    allowed = reference.pattern_allowed(spec, np.arange(query_len) + query_offset, np.arange(key_len))
    mask = padding & allowed[None, None]  # (batch, 1, query_len, key_len)
    expected, _ = reference.attention(query, key, value, mask=mask, bias=bias, scale=0.5)

    def attend(query, key, value, bias):
        return KERNELS[kernel](
            query, key, value, mask=padding, bias=bias, pattern=pattern, query_offset=query_offset, scale=0.5
        )

    tensors = [tf.constant(t) for t in (query, key, value, bias)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        output = attend(*tensors)
        loss = tf.reduce_sum(output * tf.cos(tf.range(DEPTH, dtype="float32")))
    grads = tape.gradient(loss, tensors)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    rows_without_keys = ~mask.any(-1)  # (batch, 1, query_len)
    assert np.all(np.asarray(output)[np.transpose(rows_without_keys, (0, 2, 1))[..., 0]] == 0.0)

    tensors64 = [tf.constant(t, "float64") for t in (query, key, value, bias)]
    with tf.GradientTape() as tape:
        tape.watch(tensors64)
        dense = scaled_dot_product_attention(*tensors64[:3], mask=mask, bias=tensors64[3], scale=0.5)
        loss = tf.reduce_sum(dense * tf.cos(tf.range(DEPTH, dtype="float64")))
    for got, want in zip(grads, tape.gradient(loss, tensors64)):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_blockwise_takes_a_tensor_offset_for_cached_decoding():
    pattern, spec = PATTERNS["sparse_transformer"]
    query, key, value, _, _ = _inputs(np.random.default_rng(3), 2, 11)
    compiled = tf.function(
        lambda offset: blockwise_attention(
            query, key, value, pattern=pattern, query_offset=offset, scale=0.5, query_block_size=2, key_block_size=3
        ),
        jit_compile=True,
    )
    for offset in (0, 4, 9):
        mask = reference.pattern_allowed(spec, np.arange(2) + offset, np.arange(11))[None, None]
        expected, _ = reference.attention(query, key, value, mask=mask, scale=0.5)
        np.testing.assert_allclose(compiled(tf.constant(offset)), expected, atol=FLOAT32_ATOL)


def test_shorthands_are_the_patterns():
    assert repr(patterns.from_shorthands(None, True, None)) == repr(Causal())
    assert repr(patterns.from_shorthands(None, True, 4)) == repr(Causal() & SlidingWindow(4))
    assert repr(patterns.from_shorthands(Strided(2), False, 4)) == repr(Strided(2) & SlidingWindow(4))
    assert patterns.from_shorthands(None, False, None) is None
