"""The cost features of one attention call on one kernel: what `keras_attn.dispatch.cost_model` weighs.

A kernel module declares `cost_features(call)` (beside `why_unsupported` and `attend`) from what it
computes and holds for an `AttentionCall` with static lengths: the query-key pairs it computes per
batch element and head (the pattern's keys per query, or more when its blocks overshoot), its loop
steps, and the pairwise values it holds at its peak. `features` turns those three counts into the
named features; the cost model's fitted coefficients turn the features into seconds and bytes.

Time features (`TIME_FEATURES`): `calls` (1: a fixed cost per call), `steps` (loop iterations:
their per-step overhead), `pairs` (pairs computed over all batch elements and heads: the
element-wise softmax work), `dropout_pairs` (the same pairs when dropout is active: drawing and
applying keep-masks), `flops` (the two products, `2 * pairs * (depth + value_depth)`).

A kernel whose loop is Python's (`unrolled=True`: each step is ops of its own in the graph, as the
chunked kernel's chunks and tiles) also grows the graph with its steps, and tracing with it
(thousands of steps take minutes): a cost paid before the first call that no per-call feature
sees, so `"auto"` does not take a kernel unrolling more than `MAX_UNROLLED_STEPS`.

Memory features (`MEMORY_FEATURES`, bytes): `pairwise_bytes` (the pairwise float values held at
once, plus one byte per pair of a materialised boolean mask), `dropout_bytes` (the same values
again when dropout is active: keep-masks and dropped weights), `linear_bytes` (query, key, value
and output: what every kernel holds, linear in the lengths).
"""

import dataclasses

import keras

TIME_FEATURES = ("calls", "steps", "pairs", "dropout_pairs", "flops")
MEMORY_FEATURES = ("pairwise_bytes", "dropout_bytes", "linear_bytes")
FLOAT32_BYTES = 4  # logits and weights are float32 on every kernel of the registry
MAX_UNROLLED_STEPS = 512  # the most steps `"auto"` lets a kernel unroll into the graph
# A kernel's features sum over its blocks (query chunks, query blocks, band chunks); beyond this
# many blocks, over this many evenly spaced ones, each standing for its share: a pattern's per-block
# counts are piecewise linear in the block index, so the estimate stays within about a block per
# sample, and a call of two billion tokens is predicted in milliseconds rather than minutes.
MAX_SUMMED_BLOCKS = 2048


@dataclasses.dataclass(frozen=True)
class Features:
    """Named features of one call on one kernel: `time` over `TIME_FEATURES`, `memory` over
    `MEMORY_FEATURES`, whether its `steps` are unrolled into the graph (`unrolled`), and whether it
    holds the tensors of Keras's layer (`materialised`: the whole logits and weights), whose
    memory coefficients then predict its bytes too."""

    time: dict
    memory: dict
    unrolled: bool = False
    materialised: bool = False


def unrolls_too_many_steps(features):
    """Whether a kernel's `Features` unroll more than `MAX_UNROLLED_STEPS` steps into the graph
    (what `"auto"` does not take)."""
    return features.unrolled and features.time["steps"] > MAX_UNROLLED_STEPS


def sampled_blocks(count):
    """`(indices, weight)`: the block indices out of `count` a feature sums over, and how many
    blocks each stands for (all of them, weight 1, up to `MAX_SUMMED_BLOCKS`).

    >>> sampled_blocks(3)
    (range(0, 3), 1.0)
    >>> indices, weight = sampled_blocks(2**24)
    >>> len(indices), weight, indices[-1]
    (2048, 8192.0, 16777215)
    """
    if count <= MAX_SUMMED_BLOCKS:
        return range(count), 1.0
    indices = [(index * (count - 1)) // (MAX_SUMMED_BLOCKS - 1) for index in range(MAX_SUMMED_BLOCKS)]
    return indices, count / len(indices)


def sizes(call):
    """`(batch, query_len, key_len, heads, depth, value_depth)` of the call; an unknown batch counts as 1."""
    batch, query_len, heads, depth = call.query.shape
    key_len, value_depth = call.key.shape[1], call.value.shape[-1]
    return batch or 1, query_len, key_len, heads or 1, depth or 1, value_depth or 1


def features(call, computed_pairs, steps, held_pairs, held_itemsize=FLOAT32_BYTES, mask_pairs=0, unrolled=False):
    """The `Features` of a kernel computing `computed_pairs` pairs per batch element and head in
    `steps` loop steps (`unrolled`: a Python loop, each step in the graph), holding `held_pairs`
    pairwise values of `held_itemsize` bytes per batch element and head at its peak, and
    `mask_pairs` boolean mask values per batch element.

    Example:

    >>> query = keras.KerasTensor((2, 16, 4, 8))
    >>> from keras_attn.kernels.call import AttentionCall
    >>> f = features(AttentionCall(query, query, query), computed_pairs=256, steps=1, held_pairs=256)
    >>> f.time["pairs"], f.time["flops"], f.memory["pairwise_bytes"]
    (2048.0, 65536.0, 8192.0)
    """
    batch, query_len, key_len, heads, depth, value_depth = sizes(call)
    pairs = batch * heads * computed_pairs
    dropout = call.dropout_rate > 0.0
    held_bytes = batch * heads * held_pairs * held_itemsize
    itemsize = itemsize_of(call.value.dtype)
    time = {
        "calls": 1.0,
        "steps": float(steps),
        "pairs": float(pairs),
        "dropout_pairs": float(pairs if dropout else 0),
        "flops": float(2 * pairs * (depth + value_depth)),
    }
    memory = {
        "pairwise_bytes": float(held_bytes + batch * mask_pairs),
        "dropout_bytes": float(held_bytes if dropout else 0),
        "linear_bytes": float(batch * heads * (query_len + key_len) * (depth + value_depth) * itemsize),
    }
    return Features(time=time, memory=memory, unrolled=unrolled)


def itemsize_of(dtype):
    """Bytes per value of a float dtype (`"bfloat16"` -> 2), from the bits its name ends with.

    >>> itemsize_of("bfloat16"), itemsize_of("float32")
    (2, 4)
    """
    return int(keras.backend.standardize_dtype(dtype).lstrip("bfloat")) // 8


def materialises_mask(call):
    """Whether a kernel holding the whole `(query_len, key_len)` weights also builds a boolean mask of them."""
    return any(part is not None for part in (call.mask, call.bias, call.pattern, call.query_segment_ids))


def materialised(call, itemsize):
    """The `Features` of attention that materialises the whole `(query_len, key_len)` logits and
    weights in `itemsize`-byte floats, in one step: the dense kernel (float32) and Keras's layer (its
    compute dtype), which hold the same tensors: one memory model predicts both, in their bytes."""
    _, query_len, key_len, _, _, _ = sizes(call)
    pairs = query_len * key_len
    held = features(
        call,
        computed_pairs=pairs,
        steps=1,
        held_pairs=pairs,
        held_itemsize=itemsize,
        mask_pairs=pairs if materialises_mask(call) else 0,
    )
    return dataclasses.replace(held, materialised=True)
