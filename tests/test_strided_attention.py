"""keras_attn.kernels.strided against float64 attention under the Sparse Transformer's patterns.

Oracle: `reference.attention` (NumPy float64) under the mask `reference.pattern_allowed` builds
from the patterns' definitions, merged with the caller's mask; gradients against
`reference.attention_gradients` under that merged mask. Small chunk and step sizes make every call cross several
band chunks and residue steps.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.dispatch import attention as attention_module
from keras_attn.dispatch import cost_model
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import strided
from keras_attn.kernels import strided_layout
from keras_attn.kernels.call import AttentionCall
from keras_attn.kernels.strided import strided_attention
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import Causal
from keras_attn.patterns import GlobalTokens
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference
from tests.dispatch_rule import rule_choice
from tests.layer_checks import assert_jit_matches_eager

BATCH, HEADS, DEPTH = 2, 2, 4
WINDOW = ("window", 3)
STRIDE = ("strided", 3)
PATTERNS = {
    "causal_strided": (Causal() & (SlidingWindow(3) | Strided(3)), ("and", ("causal",), ("or", WINDOW, STRIDE))),
    "strided": (SlidingWindow(3) | Strided(3), ("or", WINDOW, STRIDE)),
    "causal_residues_only": (Causal() & Strided(4), ("and", ("causal",), ("strided", 4))),
    "strided_global": (
        SlidingWindow(3) | Strided(3) | GlobalTokens(2),
        ("or", ("or", WINDOW, STRIDE), ("global", 2)),
    ),
    "causal_strided_global": (
        Causal() & (SlidingWindow(4) | Strided(4) | GlobalTokens(1)),
        ("and", ("causal",), ("or", ("or", ("window", 4), ("strided", 4)), ("global", 1))),
    ),
}


@pytest.fixture
def small_steps(monkeypatch):
    """Band chunks of 4 queries and one residue per strided step."""
    monkeypatch.setattr(strided_layout, "BAND_CHUNK_SIZE", 4)
    monkeypatch.setattr(strided_layout, "STRIDED_STEP_SIZE", 1)


def _inputs(rng, query_len, key_len, dtype="float64"):
    return [
        rng.standard_normal((BATCH, length, HEADS, DEPTH)).astype(dtype) for length in (query_len, key_len, key_len)
    ]


def _mask(rng, kind, query_len, key_len):
    """The caller's mask: key padding, query padding, or a full random mask with a fully masked row."""
    if kind == "none":
        return None
    if kind == "keys":
        return (np.arange(key_len)[None, :] < np.array([key_len, key_len - 3])[:, None]).reshape(BATCH, 1, 1, key_len)
    if kind == "queries":
        return (np.arange(query_len)[None, :] < np.array([query_len, query_len - 2])[:, None]).reshape(
            BATCH, 1, query_len, 1
        )
    mask = rng.random((BATCH, HEADS, query_len, key_len)) < 0.7
    mask[0, 1, 2, :] = False
    return mask


def _merged(spec, mask, query_len, key_len, query_offset):
    allowed = reference.pattern_allowed(spec, np.arange(query_len) + query_offset, np.arange(key_len))[None, None]
    return allowed if mask is None else allowed & mask  # (batch | 1, heads | 1, query_len, key_len)


def _loss(output):
    return tf.reduce_sum(output * tf.cos(tf.range(DEPTH, dtype=output.dtype)))


def _loss_gradients(attend):
    """The function of `(query, key, value)` giving the gradients of `_loss(attend(...))`."""

    def gradients(query, key, value):
        with tf.GradientTape() as tape:
            tape.watch([query, key, value])
            loss = _loss(attend(query, key, value))
        return tape.gradient(loss, [query, key, value])

    return gradients


MASK_KINDS = ("none", "keys", "queries", "full")
SHAPES = ((13, 13, 0), (5, 14, 9), (17, 11, 0), (10, 23, 7))  # (query_len, key_len, query_offset)
# Every pattern meets every mask kind and every shape (rotated, not their product).
CASES = [
    (name, kind, SHAPES[(index + shift) % len(SHAPES)])
    for shift, name in enumerate(sorted(PATTERNS))
    for index, kind in enumerate(MASK_KINDS)
]


@pytest.mark.parametrize("name, mask_kind, shape", CASES)
def test_matches_float64_reference_values_and_gradients(small_steps, name, mask_kind, shape):
    query_len, key_len, query_offset = shape
    pattern, spec = PATTERNS[name]
    rng = np.random.default_rng(query_len * key_len)
    query, key, value = _inputs(rng, query_len, key_len)
    mask = _mask(rng, mask_kind, query_len, key_len)
    merged = _merged(spec, mask, query_len, key_len, query_offset)
    expected, _ = reference.attention(query, key, value, mask=merged, scale=0.5)

    tensors = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        output = strided_attention(*tensors, mask=mask, pattern=pattern, query_offset=query_offset, scale=0.5)
        loss = _loss(output)
    grads = tape.gradient(loss, tensors)
    np.testing.assert_allclose(output, expected, atol=1e-12)
    without_keys = ~np.broadcast_to(merged, (BATCH, HEADS, query_len, key_len)).any(-1)  # (batch, heads, query_len)
    assert np.all(np.transpose(np.asarray(output), (0, 2, 1, 3))[without_keys] == 0.0)

    output_gradient = np.broadcast_to(np.cos(np.arange(DEPTH)), expected.shape)  # d loss / d output
    for got, want in zip(
        grads, reference.attention_gradients(query, key, value, output_gradient, mask=merged, scale=0.5)
    ):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_fully_masked_rows_give_zero_output_and_gradients(small_steps):
    pattern, _ = PATTERNS["causal_strided"]
    query, key, value = (tf.constant(t) for t in _inputs(np.random.default_rng(1), 9, 9))
    mask = np.ones((BATCH, 1, 9, 9), bool)
    mask[1, 0, 4:, :] = False  # rows 4.. of the second sequence see nothing
    with tf.GradientTape() as tape:
        tape.watch(query)
        output = strided_attention(query, key, value, mask=mask, pattern=pattern, scale=0.5)
        loss = _loss(output)
    assert np.all(np.asarray(output)[1, 4:] == 0.0)
    query_grad = np.asarray(tape.gradient(loss, query))
    assert np.all(query_grad[1, 4:] == 0.0) and np.all(np.isfinite(query_grad))


def test_padded_keys_content_never_reaches_real_outputs(small_steps):
    pattern, _ = PATTERNS["causal_strided"]
    query, key, value = _inputs(np.random.default_rng(2), 12, 12, "float32")
    mask = _mask(None, "keys", 12, 12)
    clean = scaled_dot_product_attention(query, key, value, mask=mask, pattern=pattern, implementation="strided")
    key[1, 9:], value[1, 9:] = np.nan, np.inf  # the second sequence's padding
    dirty = scaled_dot_product_attention(query, key, value, mask=mask, pattern=pattern, implementation="strided")
    np.testing.assert_array_equal(dirty, clean)


def test_eager_tf_function_and_xla_agree():
    pattern, spec = PATTERNS["causal_strided"]
    query, key, value = _inputs(np.random.default_rng(3), 14, 14, "float32")
    mask = _mask(None, "keys", 14, 14)
    expected, _ = reference.attention(query, key, value, mask=_merged(spec, mask, 14, 14, 0), scale=0.5)

    def attend(query, key, value):
        return strided_attention(query, key, value, mask=mask, pattern=pattern, scale=0.5)

    np.testing.assert_allclose(attend(query, key, value), expected, atol=2e-5)
    assert_jit_matches_eager(attend, (query, key, value))

    assert_jit_matches_eager(_loss_gradients(attend), tuple(tf.constant(t) for t in (query, key, value)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_is_finite_and_close_to_float32(small_steps, dtype):
    pattern, _ = PATTERNS["causal_strided"]
    query, key, value = _inputs(np.random.default_rng(4), 12, 12, "float32")
    full = strided_attention(query, key, value, pattern=pattern, scale=0.5)
    half = strided_attention(*(tf.cast(t, dtype) for t in (query, key, value)), pattern=pattern, scale=0.5)
    assert half.dtype == dtype
    np.testing.assert_allclose(tf.cast(half, "float32"), full, atol=3e-2)


SPARSE_TRANSFORMER = Causal() & (SlidingWindow(256) | Strided(256))
SMALL_STRIDE = Causal() & (SlidingWindow(32) | Strided(32))  # 191 keys per query of 1,024


def _call(length, pattern=SPARSE_TRANSFORMER, **overrides):
    query = keras.KerasTensor((1, length, 8, 32))
    return AttentionCall(**{"query": query, "key": query, "value": query, "pattern": pattern, **overrides})


@pytest.mark.parametrize(
    "call, strided_takes_it",
    [
        (_call(4096, SPARSE_TRANSFORMER), True),
        (_call(16384, SlidingWindow(128) | Strided(128)), True),
        (_call(4096, Causal()), False),  # no strided part
        (_call(16384, BlockLocal(256)), False),  # no strided part
        (_call(512, SPARSE_TRANSFORMER), True),  # a band slice and a residue class are most keys
        (_call(1024, SMALL_STRIDE), True),
        (_call(2048, SMALL_STRIDE), True),
        (_call(4096, SPARSE_TRANSFORMER, bias=keras.KerasTensor((1, 8, 4096, 4096))), False),
        (_call(4096, SPARSE_TRANSFORMER, dropout_rate=0.1), False),
        (_call(4096, SPARSE_TRANSFORMER, return_weights=True), False),  # dense: the only kernel returning weights
        (_call(4096, SPARSE_TRANSFORMER, query_offset=tf.constant(0)), False),  # tensor offset
    ],
)
def test_auto_picks_strided_only_where_it_applies_and_by_the_rule(call, strided_takes_it):
    chosen = attention_module._choose_implementation("auto", call)
    assert chosen == rule_choice(cost_model.explain(call))
    assert (strided.why_unsupported(call) is None) == strided_takes_it
    if not strided_takes_it:
        assert chosen != "strided"
    if call.return_weights:
        assert chosen == "dense"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(pattern=Causal()), "strided part"),
        (dict(bias=keras.KerasTensor((1, 8, 64, 64))), "bias"),
        (dict(dropout_rate=0.5), "dropout"),
        (dict(query_offset=tf.constant(3)), "query_offset"),
        (dict(return_weights=True), "return_weights"),
        (dict(hard=True), "hard"),
    ],
)
def test_explicit_strided_refuses_what_it_cannot_take(overrides, message):
    call = _call(64, **overrides)
    with pytest.raises(ValueError, match=message):
        attention_module._choose_implementation("strided", call)


# Packed rows: documents of 5, 6 and 4 tokens, then padding (band chunks of 4, one residue per step).
PACKED_IDS = np.array([[1] * 5 + [2] * 6 + [3] * 4 + [0] * 5, [1] * 8 + [2] * 8 + [0] * 4], "int32")


def _document_mask(query_ids, key_ids):
    """NumPy `(batch, 1, q, k)`: same non-zero document."""
    return ((query_ids[:, :, None] == key_ids[:, None, :]) & (query_ids[:, :, None] != 0))[:, None]


PACKED_CASES = [
    ("causal_strided", "none", 0),
    ("strided", "keys", 0),
    ("causal_strided_global", "full", 0),
    ("causal_residues_only", "none", 0),
    ("causal_strided", "none", 13),  # decoding: 7 new queries over a cache of 20 keys
]


@pytest.mark.parametrize("name, mask_kind, query_offset", PACKED_CASES)
def test_packed_rows_match_the_float64_reference_of_each_document(small_steps, name, mask_kind, query_offset):
    pattern, spec = PATTERNS[name]
    key_len = PACKED_IDS.shape[1]
    query_len = key_len - query_offset
    key_ids, query_ids = PACKED_IDS, PACKED_IDS[:, query_offset:]
    rng = np.random.default_rng(query_offset + len(name))
    query, key, value = _inputs(rng, query_len, key_len)
    mask = _mask(rng, mask_kind, query_len, key_len)
    merged = _merged(spec, mask, query_len, key_len, query_offset) & _document_mask(query_ids, key_ids)
    expected, _ = reference.attention(query, key, value, mask=merged, scale=0.5)

    tensors = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        documents = dict(query_segment_ids=query_ids, key_segment_ids=key_ids)
        output = strided_attention(
            *tensors, mask=mask, pattern=pattern, query_offset=query_offset, scale=0.5, **documents
        )
        loss = _loss(output)
    np.testing.assert_allclose(output, expected, atol=1e-12)
    assert np.all(np.asarray(output)[query_ids == 0] == 0.0)
    output_gradient = np.broadcast_to(np.cos(np.arange(DEPTH)), expected.shape)
    wants = reference.attention_gradients(query, key, value, output_gradient, mask=merged, scale=0.5)
    for got, want in zip(tape.gradient(loss, tensors), wants):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_packed_rows_agree_eagerly_in_a_graph_under_xla_and_in_float16():
    pattern, spec = PATTERNS["causal_strided"]
    query, key, value = _inputs(np.random.default_rng(5), 20, 20, "float32")
    merged = _merged(spec, None, 20, 20, 0) & _document_mask(PACKED_IDS, PACKED_IDS)
    expected, _ = reference.attention(query, key, value, mask=merged, scale=0.5)

    def attend(query, key, value):
        return scaled_dot_product_attention(
            query, key, value, pattern=pattern, scale=0.5, segment_ids=PACKED_IDS, implementation="strided"
        )

    output = attend(query, key, value)
    np.testing.assert_allclose(output, expected, atol=2e-5)
    assert np.all(np.asarray(output)[PACKED_IDS == 0] == 0.0)

    assert_jit_matches_eager(_loss_gradients(attend), tuple(tf.constant(t) for t in (query, key, value)))
    half = attend(*(tf.cast(t, "float16") for t in (query, key, value)))
    assert half.dtype == "float16" and np.all(np.asarray(half)[PACKED_IDS == 0] == 0.0)
    np.testing.assert_allclose(tf.cast(half, "float32"), expected, atol=3e-2)


def test_steps_without_a_shared_document_are_the_ones_skipped(small_steps):
    # Band chunks (forward queries, backward keys) and residue steps are skipped exactly where the
    # NumPy document mask has no pair: here the padding. A residue step holds a token of every
    # document at least `stride` long, so on packed text it is computed and masked, never skipped.
    pattern, _ = PATTERNS["causal_strided"]
    ids = np.array([[1] * 7 + [2] * 6 + [0] * 11] * BATCH, "int32")
    length = ids.shape[1]
    plan = strided_layout.plan_of(pattern, length, length, 0)
    masks = strided_layout.PartMasks.of(None, plan, (tf.constant(ids), tf.constant(ids)))
    padded = np.pad(ids, [[0, 0], [0, plan.num_chunks * plan.chunk - length]])
    allowed = _document_mask(padded, np.pad(ids, [[0, 0], [0, plan.num_key_chunks * plan.key_chunk - length]]))[:, 0]
    band = [
        (strided_layout.band_may_share(masks, index * plan.chunk, plan.chunk, start, plan.band_width), index, start)
        for index, start in enumerate(plan.band_starts)
    ]
    for may_share, index, start in band:
        rows, cols = slice(index * plan.chunk, (index + 1) * plan.chunk), slice(start, start + plan.band_width)
        assert bool(may_share) == allowed[:, rows, cols].any()
    assert sum(not bool(may_share) for may_share, _, _ in band) == 2  # the chunks of queries 16..23
    residues = [bool(strided_layout.grid_may_share(plan, masks, step)) for step in range(plan.num_steps)]
    assert all(residues) and len(residues) == 3
    only_padding = strided_layout.PartMasks.of(None, plan, (tf.zeros_like(ids), tf.constant(ids)))
    assert not any(bool(strided_layout.grid_may_share(plan, only_padding, step)) for step in range(plan.num_steps))
