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

The masks of a call (`merged_mask`): `query_mask` `(batch, d_1, ..., d_n)` (the query's shape
without its features) marks padded queries, `value_mask` and `key_mask` (the key's shape without
its features) padded keys, as `(batch, seq)` masks do over one axis; an `attention_mask` is in
Keras's layout `(batch, <other axes>, [heads,] <query attention axes>, <key attention axes>)`. A
mask that cannot broadcast there is refused naming it (`check_masks`); a query whose keys the masks
all exclude outputs zeros (`rows_with_keys`), the library's contract, not the output projection's bias.
"""

import functools
import operator

from keras import ops

from keras_attn.layers.mask_arguments import broadcastable_to


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
    axes, others = resolved(attention_axes, rank - 1)  # the inputs' rank is rank - 1
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
    mask = keras_expanded(ops.cast(mask, "bool"), len(batch_sizes) + 1 + 2 * num_axes, num_axes)
    heads = mask.shape[len(batch_sizes)]  # the mask's heads axis: 1, or one row per head
    mask = ops.broadcast_to(mask, (*batch_sizes, heads, *query_sizes, *key_sizes))
    return ops.reshape(mask, (_product(batch_sizes), heads, _product(query_sizes), _product(key_sizes)))


def resolved(attention_axes, rank):
    """`(axes, others)`: the attention axes of rank-`rank` inputs `(batch, d_1, ..., d_n, features)` as
    positive ints, in `attention_axes`' order, and the other axes between batch and features."""
    axes = tuple(axis + rank if axis < 0 else axis for axis in attention_axes)
    return axes, tuple(axis for axis in range(1, rank - 1) if axis not in axes)


def check_masks(query_shape, key_shape, num_heads, attention_axes, **masks):
    """A `ValueError` naming the first mask (`name=tensor`, `None` skipped) whose known shape cannot
    broadcast to the one it marks (the module's docstring), with the shape it needs."""
    axes, others = resolved(attention_axes, len(query_shape))
    sizes = (query_shape[0], *(query_shape[axis] for axis in others))
    query_axes, key_axes = tuple(query_shape[axis] for axis in axes), tuple(key_shape[axis] for axis in axes)
    targets = {
        "query_mask": [tuple(query_shape[:-1])],
        "value_mask": [tuple(key_shape[:-1])],
        "key_mask": [tuple(key_shape[:-1])],
        "attention_mask": [(*sizes, *query_axes, *key_axes), (*sizes, num_heads, *query_axes, *key_axes)],
    }
    for name, mask in masks.items():
        if mask is None:
            continue
        shape = tuple(mask.shape)
        expand = name == "attention_mask"  # a padding mask has the input's rank
        shapes = [_keras_expanded(shape, len(target), len(axes)) if expand else shape for target in targets[name]]
        if not any(broadcastable_to(shape, target) for shape, target in zip(shapes, targets[name])):
            raise ValueError(
                f"`{name}` must be broadcastable to {' or '.join(map(str, targets[name]))} "
                f"(query.shape={tuple(query_shape)}, key.shape={tuple(key_shape)}, attention_axes={attention_axes}). "
                f"Received: {name}.shape={shape}"
            )


def _keras_expanded(shape, rank, num_axes):
    """`keras_expanded` on a static shape; unchanged when it cannot be expanded."""
    at = len(shape) - 2 * num_axes
    return shape if at < 0 or len(shape) > rank else (*shape[:at], *(1,) * (rank - len(shape)), *shape[at:])


def merged_mask(query, attention_axes, query_mask, key_mask, attention_mask, causal_mask=None):
    """The padding masks (`key_mask`: the value's and the key's merged), the `attention_mask` and a
    `causal_mask` (Keras's `(1, query_len, key_len)`) as one boolean mask in Keras's layout,
    `(batch | 1, <other axes> | 1, [heads | 1,] <query attention axes> | 1, <key attention axes> | 1)`
    (with the heads axis when a mask has it), or `None`."""
    axes, others = resolved(attention_axes, len(query.shape))
    order = (0, *others, *axes)
    masks = [mask for mask in (attention_mask, causal_mask) if mask is not None]
    if query_mask is not None:  # (batch, <other>, <query axes>, 1...)
        mask = ops.transpose(ops.cast(query_mask, "bool"), order)
        masks.append(ops.reshape(mask, (*ops.shape(mask), *(1,) * len(axes))))
    if key_mask is not None:  # (batch, <other>, 1..., <key axes>)
        mask = ops.transpose(ops.cast(key_mask, "bool"), order)
        sizes, at = ops.shape(mask), 1 + len(others)
        masks.append(ops.reshape(mask, (*sizes[:at], *(1,) * len(axes), *sizes[at:])))
    if not masks:
        return None
    rank = max(1 + len(others) + 2 * len(axes), *(len(mask.shape) for mask in masks))
    merged = None
    for mask in masks:
        mask = keras_expanded(ops.cast(mask, "bool"), rank, len(axes))
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def keras_expanded(mask, rank, num_axes):
    """`mask` expanded to `rank` as Keras's `_masked_softmax` expands an attention mask over `num_axes`
    attention axes: size-1 axes before its query attention axes (`_keras_expanded` on shapes)."""
    while len(mask.shape) < rank:
        mask = ops.expand_dims(mask, axis=-2 * num_axes - 1)
    return mask


def rows_with_keys(mask, query, attention_axes):
    """`(batch, d_1, ..., d_n)`: whether each query of the inputs `query` sees a key under `mask`
    (`merged_mask`'s layout) in any head; `None` (every query) when `mask` is."""
    if mask is None:
        return None
    axes, others = resolved(attention_axes, len(query.shape))
    mask = keras_expanded(mask, 2 + len(others) + 2 * len(axes), len(axes))  # with the heads axis
    key_axes = tuple(range(len(mask.shape) - len(axes), len(mask.shape)))
    rows = ops.any(mask, axis=(1 + len(others), *key_axes))  # (batch | 1, <other> | 1, <query axes> | 1)
    order = (0, *others, *axes)
    rows = ops.broadcast_to(rows, tuple(ops.shape(query)[axis] for axis in order))
    return ops.transpose(rows, _inverse(order))  # (batch, d_1, ..., d_n)
