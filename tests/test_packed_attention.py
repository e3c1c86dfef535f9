"""Packed rows (several documents per row, `segment_ids`) on every kernel of the registry: outputs and
gradients equal those of each document run alone (a float64 NumPy reference), and the blockwise
kernel never computes a block in which no query shares a document with a key.

Two rows pack documents of uneven lengths differently and end with padding. The patterns depend
only on `i - j` (causal, sliding window, strided), so a document run alone sees the same pattern as
inside the row. Lengths span several query chunks and key blocks of the kernels' defaults, so the
documents straddle block boundaries.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels import KERNELS
from keras_attn.kernels.blockwise import blockwise_attention
from keras_attn.patterns import Causal
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from keras_attn.patterns import document_mask
from keras_attn.positions.alibi import ALiBi
from tests import reference
from tests.kernel_registry import kernels_taking
from tests.layer_checks import output_gradients

HEADS, DEPTH, VALUE_DEPTH = 2, 8, 6
SCALE = DEPTH**-0.5
# Document lengths per row; the rest of the row is padding (segment 0).
PACKINGS = ((40, 70, 25), (90, 12, 38))
LENGTH = 150
# name -> (pattern, its definition for `reference.pattern_allowed`, or None for every pair)
PATTERNS = {
    "none": (None, None),
    "causal": (Causal(), ("causal",)),
    "window": (SlidingWindow(7), ("window", 7)),
    "causal_strided": (
        Causal() & (SlidingWindow(6) | Strided(6)),
        ("and", ("causal",), ("or", ("window", 6), ("strided", 6))),
    ),
}
KERNEL_PATTERNS = [
    (kernel, name) for name, (pattern, _) in PATTERNS.items() for kernel in kernels_taking(pattern=pattern)
]
# float16 is the compute dtype of the mixed_float16 policy; "xla" is float32 under jit_compile=True.
MODES = {"float32": 2e-5, "mixed_float16": 2e-2, "xla": 2e-5}


def test_every_kernel_is_covered():
    assert {kernel for kernel, _ in KERNEL_PATTERNS} == set(KERNELS)


def segment_ids(packings, length):
    """Int32 `(len(packings), length)`: documents `1, 2, ...` in order, then padding."""
    ids = np.zeros((len(packings), length), np.int32)
    for row, lengths in enumerate(packings):
        ends = np.cumsum(lengths)
        for number, (start, end) in enumerate(zip(ends - lengths, ends), 1):
            ids[row, start:end] = number
    return ids


def documents(ids):
    """`(row, slice)` of every document of int `(batch, length)` segment ids."""
    return [
        (
            row,
            slice(
                int(np.argmax(ids[row] == number)), int(np.argmax(ids[row] == number)) + int(np.sum(ids[row] == number))
            ),
        )
        for row in range(ids.shape[0])
        for number in np.unique(ids[row][ids[row] != 0])
    ]


def inputs(rng, batch, length, dtype="float32"):
    shapes = ((batch, length, HEADS, DEPTH), (batch, length, HEADS, DEPTH), (batch, length, HEADS, VALUE_DEPTH))
    return [rng.normal(size=shape).astype(dtype) for shape in shapes]


def allowed(spec, size):
    return (
        np.ones((size, size), bool)
        if spec is None
        else reference.pattern_allowed(spec, np.arange(size), np.arange(size))
    )


def alone(ids, query, key, value, output_grad, spec, bias=None, alibi=False):
    """Float64 output and (query, key, value, bias) gradients of each document run alone, placed in the row.

    Padding positions stay 0: no query there, no key seen there. `bias` is `(1, heads, length, length)`.
    """
    query, key, value, output_grad = (np.asarray(t, np.float64) for t in (query, key, value, output_grad))
    output, grads = np.zeros_like(output_grad), [np.zeros_like(query), np.zeros_like(key), np.zeros_like(value)]
    bias_grad = None if bias is None else np.zeros(bias.shape)
    for row, span in documents(ids):
        size = span.stop - span.start
        doc_bias = None if bias is None else np.asarray(bias, np.float64)[:, :, span, span]
        if alibi:
            positions = np.arange(size)
            doc_bias = (0.0 if doc_bias is None else doc_bias) + reference.alibi_bias(HEADS, positions, positions)
        doc = [t[row : row + 1, span] for t in (query, key, value)]
        kwargs = dict(mask=allowed(spec, size)[None, None], bias=doc_bias, scale=SCALE)
        output[row : row + 1, span], _ = reference.attention(*doc, **kwargs)
        *doc_grads, logits_grad = reference.attention_gradients(*doc, output_grad[row : row + 1, span], **kwargs)
        for grad, doc_grad in zip(grads, doc_grads):
            grad[row : row + 1, span] = doc_grad
        if bias_grad is not None:
            bias_grad[:, :, span, span] += logits_grad
    return output, grads, bias_grad


def run(function, tensors, output_grad, mode):
    """`function(*tensors)` and the gradients of `sum(output * output_grad)` for every tensor, as NumPy."""
    if mode != "xla":
        return np.asarray(function(*tensors), np.float64), output_gradients(function, tensors, output_grad)

    @tf.function(jit_compile=True)
    def compiled(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            output = function(*tensors)
            loss = tf.reduce_sum(tf.cast(output, output_grad.dtype) * output_grad)
        return output, tape.gradient(loss, tensors)

    output, grads = compiled(*(tf.convert_to_tensor(t) for t in tensors))
    return output.numpy().astype(np.float64), [grad.numpy() for grad in grads]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kernel, pattern_name", KERNEL_PATTERNS)
def test_packed_rows_equal_each_document_alone(kernel, pattern_name, mode):
    rng = np.random.default_rng(0)
    ids = segment_ids(PACKINGS, LENGTH)
    pattern, spec = PATTERNS[pattern_name]
    dtype = "float16" if mode == "mixed_float16" else "float32"
    query, key, value = inputs(rng, len(PACKINGS), LENGTH, dtype)
    output_grad = rng.normal(size=(len(PACKINGS), LENGTH, HEADS, VALUE_DEPTH)).astype("float32")

    def attend(query, key, value):
        return scaled_dot_product_attention(
            query, key, value, pattern=pattern, scale=SCALE, segment_ids=ids, implementation=kernel
        )

    output, grads = run(attend, (query, key, value), output_grad, mode)
    expected, expected_grads, _ = alone(ids, query, key, value, output_grad, spec)
    atol = MODES[mode]
    np.testing.assert_allclose(output, expected, atol=atol)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(grad, np.float64), expected_grad, atol=atol * 5)
    padding = ids == 0
    assert np.all(output[padding] == 0.0)  # exactly: a padded query sees no key
    assert all(np.all(grad[padding] == 0.0) for grad in grads)


BIAS_KERNELS = kernels_taking(with_bias=True, pattern=Causal(), position_bias=ALiBi(HEADS))


@pytest.mark.parametrize("with_alibi", [False, True], ids=["bias", "bias_and_alibi"])
@pytest.mark.parametrize("kernel", BIAS_KERNELS)
def test_packed_rows_with_biases_equal_each_document_alone(kernel, with_alibi):
    rng = np.random.default_rng(1)
    ids = segment_ids(PACKINGS, LENGTH)
    query, key, value = inputs(rng, len(PACKINGS), LENGTH)
    bias = rng.normal(size=(1, HEADS, LENGTH, LENGTH)).astype("float32")
    output_grad = rng.normal(size=(len(PACKINGS), LENGTH, HEADS, VALUE_DEPTH)).astype("float32")
    position_bias = ALiBi(HEADS) if with_alibi else None

    def attend(query, key, value, bias):
        return scaled_dot_product_attention(
            query,
            key,
            value,
            bias=bias,
            position_bias=position_bias,
            pattern=Causal(),
            scale=SCALE,
            segment_ids=ids,
            implementation=kernel,
        )

    output = attend(query, key, value, bias).numpy()
    *grads, bias_grad = output_gradients(attend, (query, key, value, bias), output_grad)
    expected, expected_grads, expected_bias_grad = alone(
        ids, query, key, value, output_grad, ("causal",), bias=bias, alibi=with_alibi
    )
    np.testing.assert_allclose(output, expected, atol=2e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected_grad, atol=1e-4)
    np.testing.assert_allclose(bias_grad, expected_bias_grad, atol=1e-4)


def test_bias_kernels_include_the_blockwise_kernel():
    assert "blockwise" in BIAS_KERNELS


# The blockwise kernel with small explicit blocks: many blocks per document and per row.
BLOCKS = dict(query_block_size=8, key_block_size=8)
# The last block (48..55) is padding in both rows: no query there meets a key, no key a query.
SMALL_BLOCK_PACKINGS, SMALL_BLOCK_LENGTH = ((11, 20, 9), (3, 25, 13, 2)), 56


@pytest.mark.parametrize("pattern_name", sorted(PATTERNS))
def test_blockwise_small_blocks_equal_each_document_alone(pattern_name):
    rng = np.random.default_rng(2)
    packings, length = SMALL_BLOCK_PACKINGS, SMALL_BLOCK_LENGTH
    ids = segment_ids(packings, length)
    pattern, spec = PATTERNS[pattern_name]
    query, key, value = inputs(rng, len(packings), length)
    output_grad = rng.normal(size=(len(packings), length, HEADS, VALUE_DEPTH)).astype("float32")

    def attend(query, key, value):
        return blockwise_attention(
            query, key, value, pattern=pattern, scale=SCALE, query_segment_ids=ids, key_segment_ids=ids, **BLOCKS
        )

    output = attend(query, key, value).numpy()
    grads = output_gradients(attend, (query, key, value), output_grad)
    expected, expected_grads, _ = alone(ids, query, key, value, output_grad, spec)
    np.testing.assert_allclose(output, expected, atol=2e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected_grad, atol=1e-4)
    padding = ids == 0
    assert np.all(output[padding] == 0.0) and all(np.all(grad[padding] == 0.0) for grad in grads)


def test_blockwise_cross_attention_between_packed_rows():
    # Queries and keys packed differently (a decoder's documents against an encoder's): a query
    # sees every key of its own document, the float64 reference masks by the ids.
    rng = np.random.default_rng(3)
    query_ids, key_ids = segment_ids(((5, 9, 4), (12, 6)), 20), segment_ids(((14, 10, 7), (20, 15)), 37)
    query = rng.normal(size=(2, 20, HEADS, DEPTH)).astype("float32")
    key = rng.normal(size=(2, 37, HEADS, DEPTH)).astype("float32")
    value = rng.normal(size=(2, 37, HEADS, VALUE_DEPTH)).astype("float32")
    output = blockwise_attention(
        query, key, value, scale=SCALE, query_segment_ids=query_ids, key_segment_ids=key_ids, **BLOCKS
    )
    same = (query_ids[:, :, None] == key_ids[:, None, :]) & (query_ids[:, :, None] != 0)
    expected, _ = reference.attention(query, key, value, mask=same[:, None], scale=SCALE)
    np.testing.assert_allclose(output, expected, atol=2e-5)


def test_blockwise_segment_ids_work_with_unknown_lengths():
    rng = np.random.default_rng(4)
    ids = segment_ids(SMALL_BLOCK_PACKINGS, SMALL_BLOCK_LENGTH)
    query, key, value = inputs(rng, 2, SMALL_BLOCK_LENGTH)
    spec = tf.TensorSpec((None, None, HEADS, DEPTH))

    @tf.function(
        input_signature=[
            spec,
            spec,
            tf.TensorSpec((None, None, HEADS, VALUE_DEPTH)),
            tf.TensorSpec((None, None), tf.int32),
        ]
    )
    def attend(query, key, value, ids):
        return blockwise_attention(
            query, key, value, pattern=Causal(), scale=SCALE, query_segment_ids=ids, key_segment_ids=ids, **BLOCKS
        )

    output = attend(query, key, value, ids).numpy()
    expected, _, _ = alone(ids, query, key, value, np.zeros((2, SMALL_BLOCK_LENGTH, HEADS, VALUE_DEPTH)), ("causal",))
    np.testing.assert_allclose(output, expected, atol=2e-5)


@pytest.mark.parametrize("pattern_name", ["none", "causal"])
def test_blockwise_never_computes_blocks_across_documents(pattern_name):
    # Document 1 fills key/query blocks 0-1 of both rows; the blocks of documents 2 and 3 never
    # share a document with them. NaN queries, keys and values in document 1: a computed block
    # pairing it with another document multiplies zero weights by NaN (0 * NaN = NaN) and poisons
    # that document's output and gradients -- the dense kernel, which computes every pair, does.
    rng = np.random.default_rng(5)
    ids = segment_ids(((16, 24, 8), (16, 8, 20)), 48)
    pattern, spec = PATTERNS[pattern_name]
    query, key, value = inputs(rng, 2, 48)
    poisoned = [t.copy() for t in (query, key, value)]
    for tensor in poisoned:
        tensor[:, :16] = np.nan
    output_grad = rng.normal(size=(2, 48, HEADS, VALUE_DEPTH)).astype("float32")
    output_grad[:, :16] = 0.0  # the loss reads the other documents only
    others = ids > 1

    def attend(query, key, value, implementation="blockwise"):
        return scaled_dot_product_attention(
            query, key, value, pattern=pattern, scale=SCALE, segment_ids=ids, implementation=implementation
        )

    def blockwise(query, key, value):
        return blockwise_attention(
            query, key, value, pattern=pattern, scale=SCALE, query_segment_ids=ids, key_segment_ids=ids, **BLOCKS
        )

    dense_output = attend(*poisoned, implementation="dense").numpy()
    assert np.isnan(dense_output[others]).all()  # the poison reaches whatever computes across documents
    output = blockwise(*poisoned).numpy()
    grads = output_gradients(blockwise, poisoned, output_grad)
    expected, expected_grads, _ = alone(ids, query, key, value, output_grad, spec)
    np.testing.assert_allclose(output[others], expected[others], atol=2e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        assert np.all(np.isfinite(grad[others]))
        np.testing.assert_allclose(grad[others], expected_grad[others], atol=1e-4)


def test_document_mask_composes_with_patterns():
    ids = segment_ids(((3, 5), (6,)), 9)
    spec = ("and", ("causal",), ("window", 3))
    got = document_mask(ids, pattern=Causal() & SlidingWindow(3)).numpy()
    rows = np.arange(9)
    same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] != 0)
    np.testing.assert_array_equal(got, (same & reference.pattern_allowed(spec, rows, rows))[:, None])


def test_document_mask_cross_attention_with_query_offset():
    # Cached decoding: queries 4..6 of a packed row attend causally to the cache's keys 0..6.
    key_ids = segment_ids(((4, 3),), 7)
    query_ids = key_ids[:, 4:]
    got = document_mask(query_ids, key_ids, pattern=Causal(), query_offset=4).numpy()
    want = (query_ids[:, :, None] == key_ids[:, None, :]) & (np.arange(4, 7)[:, None] >= np.arange(7)[None, :])
    np.testing.assert_array_equal(got, want[:, None])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(query_segment_ids=np.ones((1, 3), np.float32)), "query_segment_ids"),
        (dict(query_segment_ids=np.ones((3,), np.int32)), "rank 2"),
        (
            dict(query_segment_ids=np.ones((1, 3), np.int32), key_segment_ids=np.ones((1, 1, 3), np.int32)),
            "key_segment_ids",
        ),
        (dict(query_segment_ids=np.ones((1, 3), np.int32), pattern="causal"), "pattern"),
    ],
)
def test_document_mask_refuses_bad_arguments(arguments, message):
    with pytest.raises((ValueError, TypeError), match=message):
        document_mask(**arguments)
