"""Attention over several axes (`attention_axes`, e.g. an image's rows and columns) as one sequence.

Keras's `MultiHeadAttention` with `attention_axes` attends over the named axes of its projected
`(batch, d_1, ..., d_n, heads, depth)` tensors jointly, every other axis `d_i` acting as a batch
axis (`_build_attention_equation`): its scores are `(batch, <other axes>, heads, <query attention
axes>, <key attention axes>)`, softmaxed over the key attention axes. That is ordinary attention
over one sequence once the attention axes, in the order `attention_axes` names them, are flattened
into it and the other axes into the batch: `flattened` moves them there (a transpose, so any axes,
contiguous or not), runs the rank-4 kernel call, and puts the output and the scores back in Keras's
layout. A mask follows Keras's broadcasting (`expand_dims` before the query attention axes until it
has the scores' rank) and is flattened the same way.
"""

import functools
import operator

from keras import ops


def flattened(attend, query, key, value, attention_axes, mask=None, return_weights=False):
    """`attend(query, key, value, mask)` on the attention axes flattened into one sequence.

    Args:
        attend: the rank-4 attention, `(query, key, value, mask) -> (output, weights or None)`
            on `(batch, seq, heads, depth)` tensors and a boolean `(batch | 1, heads | 1, query_len,
            key_len)` mask.
        query: `(batch, d_1, ..., d_n, heads, depth)`, projected.
        key: `(batch, e_1, ..., e_n, heads, depth)`, the same sizes as the query off the attention axes.
        value: as `key`, with its own depth.
        attention_axes: the attention axes (ints between 1 and `n`, or negative from the end of the
            unprojected inputs, as an older Keras keeps them), in Keras's order.
        mask: `None` or a boolean mask broadcastable, as Keras broadcasts it, to the scores
            `(batch, <other axes>, heads, <query attention axes>, <key attention axes>)`.
        return_weights: whether `attend` returns weights to lay out as Keras's scores.

    Returns:
        `(output, scores)`: the output `(batch, d_1, ..., d_n, heads, value_depth)` and the scores in
        Keras's layout (or `None`).
    """
    rank = len(query.shape)
    axes = tuple(axis + rank - 1 if axis < 0 else axis for axis in attention_axes)  # the inputs' rank is rank - 1
    others = tuple(axis for axis in range(1, rank - 2) if axis not in axes)
    order = (0, *others, *axes, rank - 2, rank - 1)  # batch axes, then the sequence, heads, depth
    batch_sizes = [ops.shape(query)[axis] for axis in (0, *others)]
    query_sizes = [ops.shape(query)[axis] for axis in axes]
    key_sizes = [ops.shape(key)[axis] for axis in axes]
    sequences = [_as_sequence(tensor, order, len(axes)) for tensor in (query, key, value)]
    flat_mask = None if mask is None else _flat_mask(mask, batch_sizes, query_sizes, key_sizes, len(axes))
    output, weights = attend(*sequences, flat_mask)  # (batch', query_len, heads, dv), (batch', heads, q, k)
    heads, value_depth = ops.shape(output)[2], ops.shape(output)[3]
    output = ops.reshape(output, (*batch_sizes, *query_sizes, heads, value_depth))
    output = ops.transpose(output, _inverse(order))  # (batch, d_1, ..., d_n, heads, value_depth)
    if not return_weights:
        return output, None
    return output, ops.reshape(weights, (*batch_sizes, heads, *query_sizes, *key_sizes))


def _product(sizes):
    return functools.reduce(operator.mul, sizes, 1)


def _inverse(order):
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def _as_sequence(tensor, order, num_axes):
    """`(batch, ..., heads, depth)` -> `(batch', seq, heads, depth)`: batch axes first, then the attention axes."""
    tensor = ops.transpose(tensor, order)
    shape = ops.shape(tensor)
    batch_axes = len(order) - num_axes - 2
    return ops.reshape(tensor, (-1, _product(shape[batch_axes : batch_axes + num_axes]), shape[-2], shape[-1]))


def _flat_mask(mask, batch_sizes, query_sizes, key_sizes, num_axes):
    """Keras's attention mask, expanded before its query attention axes to the scores' rank (Keras's
    `_masked_softmax`), broadcast and flattened to `(batch', heads | 1, query_len, key_len)`."""
    mask = ops.cast(mask, "bool")
    scores_rank = len(batch_sizes) + 1 + 2 * num_axes
    for _ in range(scores_rank - len(mask.shape)):
        mask = ops.expand_dims(mask, axis=-2 * num_axes - 1)
    heads = mask.shape[len(batch_sizes)]  # the mask's heads axis: 1, or one row per head
    mask = ops.broadcast_to(mask, (*batch_sizes, heads, *query_sizes, *key_sizes))
    return ops.reshape(mask, (_product(batch_sizes), heads, _product(query_sizes), _product(key_sizes)))
