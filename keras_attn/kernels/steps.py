"""The loop plumbing of the streaming kernels: slices of rows, TensorArrays of loop steps, stacking.

The chunked, blockwise and strided kernels walk `(batch, heads, length, depth)` tensors in steps
(blocks of queries or keys, band chunks, residue classes) inside `tf.while_loop`s, write each
step's result to a `tf.TensorArray` and stack them back into rows.
"""

import keras
import tensorflow as tf


def rows(tensor, start, size, axis=2):
    """`size` entries of `tensor` from `start` (an int or scalar int tensor) along `axis`."""
    begin = [0] * len(tensor.shape)
    begin[axis] = start
    sizes = [-1] * len(tensor.shape)
    sizes[axis] = size
    return tf.slice(tensor, tf.stack(begin), sizes)


def block_rows(tensor, index, size):
    """Rows `[index * size, (index + 1) * size)` of a `(batch, heads, length, ...)` tensor."""
    return rows(tensor, index * size, size)


def step_array(like, size, *step_shape, dtype=None):
    """An empty TensorArray of `size` steps `(batch, heads, *step_shape)`, with `like`'s batch and
    heads and its dtype (or `dtype`)."""
    element_shape = tf.TensorShape([*like.shape[:2], *step_shape])
    return tf.TensorArray(dtype or like.dtype, size=size, element_shape=element_shape)


def zero_step_array(like, size, block):
    """A TensorArray of `size` zero steps `(batch, heads, block, depth)` of a `(batch, heads, ·, depth)` tensor."""
    batch, heads, _, depth = keras.ops.shape(like)
    zeros = tf.zeros(tf.stack([size, batch, heads, block, depth]), like.dtype)
    return step_array(like, size, block, like.shape[3]).unstack(zeros)


def unstack_steps(stacked):
    """`(steps, batch, heads, per_step, ...)` -> `(batch, heads, steps * per_step, ...)`."""
    steps, batch, heads, per_step, *rest = keras.ops.shape(stacked)
    stacked = tf.transpose(stacked, [1, 2, 0] + list(range(3, len(stacked.shape))))  # (b, h, steps, per_step, ...)
    return tf.reshape(stacked, tf.stack([batch, heads, steps * per_step, *rest]))
