"""The two products of one query's attention without transposes: a cached decoding step's matmuls.

On `(batch, key_len, heads, depth)` keys and values, `einsum("bqhd,bkhd->bhqk")` and
`einsum("bhqk,bkhd->bqhd")` transpose them to `(batch, heads, key_len, depth)` on every call. In a
cached decoding step, one query attending over the whole cache, those copies of the cache cost more
than the products in TensorFlow's op-by-op runtime. With one query both products are one batched matmul over the keys and values as they
are stored, `(batch, key_len, heads * depth)`, with the query (or the output) spread block-diagonally
over the heads: `heads` times the multiply-adds, which for a few heads cost less than the copies,
and the same sums (the extra terms are exact zeros). Under XLA, which fuses the transposes away, the
einsums stay, and so they do for a batch of several rows, where the products are batched matmuls
(oneDNN's), several times slower than the one `Einsum` op Keras's attention runs (its internal
transposes included): the block-diagonal products pay off with one row, as the 2-D matmul.
"""

import tensorflow as tf
from keras import ops

from keras_attn.utils import compiled_by_xla
from keras_attn.utils import float_math_dtype

# Up to this many heads the block-diagonal products are taken: their extra multiply-adds grow with
# `heads` (`heads` times the useful ones) while the copies they avoid do not, so many heads make the
# transposing einsums cheaper again (benchmarks/cached_decoding.py times decoding steps).
MAX_HEADS = 16


def applies(query, key):
    """Whether the block-diagonal products serve `query (batch, 1, heads, depth)` against `key`: one
    row (a batch of 1 known when traced), one query, as many key as query heads, at most `MAX_HEADS`
    of them, on TensorFlow outside XLA."""
    heads = query.shape[2]
    one_query = query.shape[0] == 1 and query.shape[1] == 1 and heads is not None
    one_query = one_query and heads == key.shape[2] and heads <= MAX_HEADS
    return one_query and key.shape[3] is not None and not compiled_by_xla()


def logits(query, key):
    """`attention_logits(query, key)` for one query: `(batch, heads, 1, key_len)` in `float_math_dtype`."""
    dtype = float_math_dtype(query.dtype)
    query, key = ops.cast(query, dtype), ops.cast(key, dtype)
    batch, key_len, heads, depth = ops.shape(key)
    query = ops.reshape(query, (batch, heads, 1, depth)) * _eye(heads, query.dtype)  # (batch, heads, heads, depth)
    spread = ops.reshape(query, (batch, heads, heads * depth))  # row h: head h's query in block h, zeros elsewhere
    keys = ops.reshape(key, (batch, key_len, heads * depth))
    return ops.reshape(_batched_matmul(spread, keys, transpose_b=True), (batch, heads, 1, key_len))


def values(weights, value):
    """`einsum("bhqk,bkhd->bqhd")` for one query: `weights (batch, heads, 1, key_len)` ->
    `(batch, 1, heads, value_depth)`."""
    batch, key_len, heads, depth = ops.shape(value)
    weights = ops.reshape(weights, (batch, heads, key_len))
    rows = _batched_matmul(weights, ops.reshape(value, (batch, key_len, heads * depth)))
    rows = ops.reshape(rows, (batch, heads, heads, depth))  # head h's weights against every head's values
    diagonal = ops.sum(rows * _eye(heads, rows.dtype), axis=2)  # (batch, heads, depth): block h of row h
    return ops.reshape(diagonal, (batch, 1, heads, depth))


def _batched_matmul(left, right, transpose_b=False):
    """`left @ right` (`right` transposed with `transpose_b`) over a leading batch axis; with a batch of
    one known now, the 2-D product, which TensorFlow's runtime runs without the fixed cost of its
    batched (oneDNN) matmul, several times the product's own at these sizes."""
    if left.shape[0] == 1 and right.shape[0] == 1:
        return tf.expand_dims(tf.linalg.matmul(left[0], right[0], transpose_b=transpose_b), 0)
    return tf.linalg.matmul(left, right, transpose_b=transpose_b)


def softmax(logits):
    """`ops.softmax(logits, axis=-1)` as its four element-wise steps: the same values (up to
    rounding), without the fused oneDNN softmax, which on a decoding step's few rows costs several
    times more. A row of no keys is empty, not an error (`tf.reduce_max`, unlike `ops.max`, takes an
    empty axis)."""
    exponentials = ops.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    return exponentials / ops.sum(exponentials, axis=-1, keepdims=True)


def _eye(heads, dtype):
    """`(heads, heads, 1)`: the identity, to keep each head's own block."""
    return ops.expand_dims(ops.eye(heads, dtype=dtype), -1)
