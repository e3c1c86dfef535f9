"""Strided sparse attention (Child et al. 2019, the Sparse Transformer) for the TensorFlow backend.

Under `Causal() & (SlidingWindow(s) | Strided(s))` query `i` sees a band of nearby keys plus every
key `j` with `(i - j) % s == 0`. That residue class reaches every key block, so the chunked and
blockwise kernels, which skip only the blocks outside `pattern.key_range`, compute the whole causal
triangle for it. This kernel does only the pattern's work, in the two parts that
`pattern.strided_cover()` names (`band`, `stride`):

- **band**: the queries in chunks of `strided_layout.BAND_CHUNK_SIZE`, each over one slice of `band_width` keys
  holding `band.key_range` of the chunk (one width for every chunk, so that the chunks run in one
  `tf.while_loop`), minus the keys of each query's residue class;
- **strided**: positions laid out as a `(length / stride, stride)` grid whose column `r` holds the
  queries and the keys of residue `r`; column by column (in groups of residues), each query
  attends to the keys of its own column that the pattern allows.

A key is in exactly one part, and the parts' softmax statistics (each row's log-sum-exp) merge
into ONE softmax over their union (`keras_attn.kernels.streaming_softmax.merge`; the inverse temperature
multiplies logits shifted by the row maximum, exact up to the float32 limit). A query computes `band_width + key_len / stride` keys instead
of up to `key_len`; memory is linear in the length: the backward pass (a `tf.custom_gradient`)
recomputes each part's weights from the merged statistics, as `keras_attn.kernels.blockwise`
does. The band's query gradient comes chunk by chunk of queries; its key and value gradients come
chunk by chunk of keys (each over one slice of `band_query_width` queries holding
`band.query_range`), so that every chunk writes its own rows once: summing the overlapping key
slices of the query chunks instead would hold about `band_width / strided_layout.BAND_CHUNK_SIZE` key-length
gradients, and summing them in the loop is slow without XLA: TensorFlow's executor copies the
tensor `tf.tensor_scatter_nd_add` adds rows into at every step, a whole key-length gradient per
chunk, where XLA updates it in place.

The contract is the core's: the mask and the pattern decide which keys a query sees, masked keys
get weight exactly 0 (their logits never enter a sum: they are selected out, not filled), and a
query that sees no key has a zero output and gradient. Math in float32 (float64 for float64
inputs) whatever the compute dtype. Not supported: an additive `bias` and attention dropout (the
dispatcher then takes another kernel).

Packed rows (`query_segment_ids` / `key_segment_ids`, `keras_attn.core.segments`): each step
intersects the pattern with the document mask of its own queries and keys, built from their ids in
the step's layout (a band chunk's rows and key slice, a residue step's grid columns), never the whole
`(query_len, key_len)` mask. A step is left out (`tf.cond`, `keras_attn.kernels.document_blocks`)
when none of its queries shares a document with its keys: a band chunk of the forward pass or of
the query gradient, a key chunk of the band's key gradient, a residue step. What that skips follows
from the layout: a band chunk's keys are its queries' neighbours, so on packed text it is skipped only
where its queries or its key slice are padding; and a residue class holds every `stride`-th token of
the whole row, so each residue step holds a token of every document at least `stride` long and is
computed whenever its residues hold a real query and a real key of the same document. Because a
residue class interleaves every document, the pairs of different documents inside a computed step are
masked (weight exactly 0) but still multiplied: the cost stays that of the pattern over the whole row
(`band_width + key_len / stride` keys per query), and a non-finite key or value of one real document
can reach another's products (padding cannot: the dispatcher zeroes it). Skipping per document would
need tiles of grid rows inside each residue step.
"""

import dataclasses

import tensorflow as tf

from keras_attn.core.segments import resolve_segment_ids
from keras_attn.core.softmax import resolved_scale
from keras_attn.core.softmax import soft_capped
from keras_attn.kernels import cost
from keras_attn.kernels import document_blocks
from keras_attn.kernels import steps
from keras_attn.kernels import streaming_softmax
from keras_attn.kernels import strided_layout
from keras_attn.kernels.call import why_not_tensorflow_streaming
from keras_attn.kernels.call import with_repeated_heads
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_scale

# One loop iteration at a time: peak memory stays one step's temporaries (as in blockwise).
_PARALLEL_ITERATIONS = 1


def why_unsupported(call):
    """Why the strided kernel cannot take this `AttentionCall` (a message), or `None` when it can."""
    streaming = why_not_tensorflow_streaming(call)
    if streaming:
        return streaming
    if call.bias is not None:
        return f"no additive `bias` (the dense, chunked and blockwise kernels take one). Received: bias={call.bias!r}"
    if call.position_bias is not None:
        return (
            "no `position_bias` (the dense, chunked and blockwise kernels take one). "
            f"Received: position_bias={call.position_bias!r}"
        )
    if call.dropout_rate:
        return f"no attention dropout. Received: dropout_rate={call.dropout_rate!r} in training"
    if call.key.shape[1] == 0:  # no band of keys to step through
        return f"at least one key. Received: key.shape={tuple(call.key.shape)}"
    return _why_not_strided(call.query, call.key, call.mask, call.pattern, call.query_offset)


def attend(call):
    """`strided_attention` of an `AttentionCall`, its grouped key/value heads repeated to the query's."""
    call = with_repeated_heads(call)
    return strided_attention(
        call.query,
        call.key,
        call.value,
        mask=call.mask,
        pattern=call.pattern,
        query_offset=call.query_offset,
        scale=call.scale,
        query_segment_ids=call.query_segment_ids,
        key_segment_ids=call.key_segment_ids,
        logit_soft_cap=call.logit_soft_cap,
    )


def keys_per_query(call):
    """Keys the kernel computes for each query of a call it takes: a band slice plus a residue class."""
    plan = strided_layout.plan_of(
        call.pattern, call.query.shape[1], call.key.shape[1], call.query_offset, sizes_only=True
    )
    return plan.band_width + plan.key_rows


def cost_features(call):
    """The `keras_attn.kernels.cost` features of a call this kernel takes: each query computes
    `keys_per_query` keys, in band chunks and residue steps, holding one step's logits at a time."""
    plan = strided_layout.plan_of(
        call.pattern, call.query.shape[1], call.key.shape[1], call.query_offset, sizes_only=True
    )
    held = max(plan.chunk * plan.band_width, plan.residues_per_step * plan.query_rows * plan.key_rows)
    return cost.features(
        call,
        computed_pairs=plan.query_len * keys_per_query(call),
        steps=plan.num_chunks + plan.num_steps,
        held_pairs=held,
    )


def _why_not_strided(query, key, mask, pattern, query_offset):
    if pattern is None or pattern.strided_cover()[1] is None:
        return (
            "a pattern with a strided part (`pattern.strided_cover()` names a stride, e.g. "
            f"`Causal() & (SlidingWindow(s) | Strided(s))`). Received: pattern={pattern!r}"
        )
    if query.shape[1] is None or key.shape[1] is None:
        return f"static lengths. Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
    if isinstance(query_offset, bool) or not isinstance(query_offset, int) or query_offset < 0:
        return f"a Python int `query_offset` >= 0. Received: query_offset={query_offset!r}"
    if mask is not None and None in tuple(mask.shape)[2:]:
        return f"`mask` with static query and key dimensions. Received: mask.shape={tuple(mask.shape)}"
    return None


def strided_attention(
    query,
    key,
    value,
    mask=None,
    pattern=None,
    query_offset=0,
    scale=None,
    query_segment_ids=None,
    key_segment_ids=None,
    logit_soft_cap=None,
):
    """Attention under a strided pattern, computing only its band and its residue classes.

    Called by `scaled_dot_product_attention(..., implementation="strided")`, which validates
    the inputs, repeats grouped key/value heads and resolves `scale` first; the arguments mean
    the same as there.

    Args:
        query: `(batch, query_len, heads, depth)`, static `query_len`.
        key: `(batch, key_len, heads, depth)`, static `key_len`.
        value: `(batch, key_len, heads, value_depth)`.
        mask: optional boolean mask broadcastable to `(batch, heads, query_len, key_len)` with
            static query and key dimensions.
        pattern: a `keras_attn.patterns.Pattern` whose `strided_cover()` names a stride; query
            `i` sits at position `i + query_offset`.
        query_offset: Python int position of the first query among the keys.
        scale: the inverse temperature multiplying the logits; `None` (default) for
            `keras_attn.core.softmax.default_scale`, `1 / sqrt(depth)`.
        query_segment_ids: optional int `(batch, query_len)` document ids of the queries (0:
            padding), with `key_segment_ids` `(batch, key_len)`: a query attends only to keys of
            its own document; the steps where none does are skipped (module docstring).
        key_segment_ids: see `query_segment_ids`.
        logit_soft_cap: optional positive number: logits `tanh(scale * Q K^T / cap) * cap`
            before the mask (`keras_attn.core.softmax.soft_capped`).

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype of `value`; fully masked rows are 0.

    Example:

    >>> from keras_attn.patterns import Causal, SlidingWindow, Strided
    >>> q = k = v = tf.random.normal((1, 1024, 2, 16))
    >>> pattern = Causal() & (SlidingWindow(32) | Strided(32))
    >>> strided_attention(q, k, v, pattern=pattern, scale=0.25).shape
    TensorShape([1, 1024, 2, 16])
    """
    check_scale(scale)  # called directly too: a scale past float32 would make every logit inf
    reason = _why_not_strided(query, key, mask, pattern, query_offset)
    if reason:
        raise ValueError(f"`strided_attention` needs {reason}")
    scale = resolved_scale(scale, query.shape[-1])
    plan = strided_layout.plan_of(pattern, query.shape[1], key.shape[1], query_offset)
    plan = dataclasses.replace(plan, soft_cap=logit_soft_cap)
    output_dtype, dtype = value.dtype, float_math_dtype(query.dtype)
    query, scale = streaming_softmax.fold_scale(
        tf.cast(query, dtype), scale, logit_soft_cap
    )  # logits in float32 whatever the dtype
    scale = None if scale is None else tf.convert_to_tensor(scale, dtype)
    query, key, value = (tf.transpose(tf.cast(t, dtype), (0, 2, 1, 3)) for t in (query, key, value))  # (b, h, len, d)
    segment_ids = resolve_segment_ids(None, query_segment_ids, key_segment_ids, plan.query_len, plan.key_len)
    masks = strided_layout.PartMasks.of(
        None if mask is None else tf.cast(mask, tf.bool), plan, None if segment_ids[0] is None else segment_ids
    )
    output = streaming_softmax.custom_gradient(  # (batch, heads, query_len, value_depth); the gradient recomputes
        lambda scale, *inputs: _forward(plan, masks, scale, *inputs),
        lambda scale, inputs, output, statistics, output_gradient: _backward(
            plan, masks, scale, inputs, output, statistics, output_gradient
        ),
        scale,
        (query, key, value),
    )
    return tf.cast(tf.transpose(output, (0, 2, 1, 3)), output_dtype)


def _partial_softmax(logits, allowed, values, scale):
    """Normalised output `(..., rows, dv)` over the allowed keys only, and the rows' statistics
    `(..., rows, 2)`: largest raw logit `M` and log-normaliser `L` (`-inf`, `-inf` without allowed keys,
    which merges as weight 0)."""
    weights, (row_max, log_normaliser) = streaming_softmax.softmax(streaming_softmax.exclude(logits, allowed), scale)
    return tf.matmul(weights, values), tf.concat([row_max, log_normaliser], -1)


def _zero_rows(like, step_shape):
    """Zeros `(batch, heads, *step_shape)` with `like`'s batch, heads and dtype: a skipped step's gradient."""
    return tf.zeros(tf.concat([tf.shape(like)[:2], step_shape], 0), like.dtype)


def _no_keys(like, rows, value_depth):
    """What a skipped step contributes to the merge: zero outputs `(batch, heads, *rows, value_depth)`
    and the statistics `(M, L) = (-inf, -inf)` of rows without keys, `(batch, heads, *rows, 2)`."""
    statistics = tf.fill(tf.concat([tf.shape(like)[:2], rows, [2]], 0), tf.constant(-float("inf"), like.dtype))
    return _zero_rows(like, [*rows, value_depth]), statistics


def _weights(logits, allowed, statistics, scale):
    """The merged softmax's weights of one block, recomputed from the rows' statistics `(M, L)`."""
    logits = streaming_softmax.exclude(logits, allowed)
    return streaming_softmax.weights(logits, scale, statistics[..., :1], statistics[..., 1:])


def _forward(plan, masks, scale, query, key, value):
    """Output `(batch, heads, query_len, dv)` and the merged statistics `(batch, heads, query_len, 2)`."""
    output, statistics = _strided_forward(plan, masks, scale, query, key, value)
    if plan.band_width == 0:
        return output, statistics
    band_output, band_statistics = _band_forward(plan, masks, scale, query, key, value)
    parts = [
        (part, stats[..., :1], stats[..., 1:]) for part, stats in ((output, statistics), (band_output, band_statistics))
    ]
    output, row_max, log_normaliser = streaming_softmax.merge(parts, scale)
    return output, tf.concat([row_max, log_normaliser], -1)


def _band_forward(plan, masks, scale, query, key, value):
    query = strided_layout.pad_chunks(plan, query)

    def step(index, outputs, statistics):
        def computed():
            _, start, logits, allowed = strided_layout.band_block(plan, masks, index, query, key)
            capped = soft_capped(logits, plan.soft_cap)
            return _partial_softmax(capped, allowed, steps.rows(value, start, plan.band_width), scale)

        may_share = strided_layout.band_may_share(
            masks, index * plan.chunk, plan.chunk, strided_layout.band_start(plan, index), plan.band_width
        )

        def skipped():
            return _no_keys(query, [plan.chunk], value.shape[-1])

        output, chunk_statistics = document_blocks.guarded(may_share, computed, skipped)
        return index + 1, outputs.write(index, output), statistics.write(index, chunk_statistics)

    outputs, statistics = tf.while_loop(
        lambda index, *_: index < plan.num_chunks,
        step,
        (
            0,
            steps.step_array(query, plan.num_chunks, plan.chunk, value.shape[-1]),
            steps.step_array(query, plan.num_chunks, plan.chunk, 2),
        ),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )[1:]
    return (steps.unstack_steps(array.stack())[:, :, : plan.query_len] for array in (outputs, statistics))


def _strided_forward(plan, masks, scale, query, key, value):
    query_grid = strided_layout.to_grid(
        query, plan.front, plan.query_rows, plan.stride
    )  # (batch, heads, stride, u, depth)
    key_grid, value_grid = (
        strided_layout.to_grid(t, 0, plan.key_rows, plan.stride) for t in (key, value)
    )  # (b, h, s, m, d)

    def step(index, outputs, statistics):
        def computed():
            _, _, logits, allowed = strided_layout.grid_block(plan, masks, index, query_grid, key_grid)
            values = steps.rows(value_grid, index * plan.residues_per_step, plan.residues_per_step)
            return _partial_softmax(soft_capped(logits, plan.soft_cap), allowed, values, scale)

        def skipped():

            return _no_keys(query, [plan.residues_per_step, plan.query_rows], value.shape[-1])

        may_share = strided_layout.grid_may_share(plan, masks, index)
        output, step_statistics = document_blocks.guarded(may_share, computed, skipped)
        return index + 1, outputs.write(index, output), statistics.write(index, step_statistics)

    outputs, statistics = tf.while_loop(
        lambda index, *_: index < plan.num_steps,
        step,
        (
            0,
            *(
                steps.step_array(query, plan.num_steps, plan.residues_per_step, plan.query_rows, depth)
                for depth in (value.shape[-1], 2)
            ),
        ),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )[1:]
    return (
        strided_layout.from_grid(steps.unstack_steps(array.stack()), plan.front, plan.query_len)
        for array in (outputs, statistics)
    )


def _backward(plan, masks, scale, inputs, output, statistics, output_gradient):
    """Gradients of [`scale`,] query, key and value, both parts recomputed from the merged statistics.

    The parts give `dZ K`, `dZ^T Q` and `P^T dO` of the logits `z = scale * (Q K^T - M)`; the raw
    logits get `scale * dZ` (`scale=None`: folded into the query, whose gradient carries it outside).
    """
    output_gradient = tf.cast(output_gradient, output.dtype)
    # rowsum(dO * O) = sum_k P_k dP_k, the subtracted term of the softmax gradient.
    delta = tf.reduce_sum(output_gradient * output, -1, keepdims=True)  # (batch, heads, query_len, 1)
    rows = (output_gradient, delta, statistics)
    grads = _strided_backward(plan, masks, scale, inputs, rows)
    if plan.band_width:
        grads = [a + b for a, b in zip(grads, _band_backward(plan, masks, scale, inputs, rows))]
    query_side, key_side, value_grad = grads
    scaled = [
        streaming_softmax.times_scale(scale, query_side),
        streaming_softmax.times_scale(scale, key_side),
        value_grad,
    ]
    return scaled if scale is None else [streaming_softmax.scale_gradient(inputs[0], query_side), *scaled]


def _logits_gradient(weights, values, output_gradient, delta):
    """`dZ`, the gradient of one block's logits `z` `(..., rows, keys)`, from its weights."""
    weights_grad = tf.matmul(output_gradient, values, transpose_b=True)  # (..., rows, keys)
    return streaming_softmax.logits_gradient(weights, weights_grad, delta)  # (..., rows, keys)


def _block_gradients(weights, capped, soft_cap, logits_inputs, values, output_gradient, delta):
    """`(dZ K, dZ^T Q, P^T dO)` of one block from its weights `(..., rows, keys)`, `dZ` carried
    through the soft cap of its `capped` logits."""
    queries, keys = logits_inputs
    logits_grad = _logits_gradient(weights, values, output_gradient, delta)  # (..., rows, keys)
    logits_grad = streaming_softmax.cap_gradient(logits_grad, capped, soft_cap)
    return (
        tf.matmul(logits_grad, keys),  # (..., rows, depth)
        tf.matmul(logits_grad, queries, transpose_a=True),  # (..., keys, depth)
        tf.matmul(weights, output_gradient, transpose_a=True),  # (..., keys, dv)
    )


def _band_backward(plan, masks, scale, inputs, rows):
    query, key, value = inputs
    query = strided_layout.pad_chunks(plan, query)
    rows = [strided_layout.pad_chunks(plan, t) for t in rows]  # output gradient, delta, statistics
    inputs = (query, key, value)
    return [
        _band_query_gradient(plan, masks, scale, inputs, rows),
        *_band_key_gradients(plan, masks, scale, inputs, rows),
    ]


def _band_query_gradient(plan, masks, scale, inputs, rows):
    """The band part's `dZ K`, chunk by chunk of queries: `(batch, heads, query_len, depth)`."""
    query, key, value = inputs

    def step(index, query_grads):
        def computed():
            _, start, logits, allowed = strided_layout.band_block(plan, masks, index, query, key)
            output_gradient, delta, statistics = (steps.rows(t, index * plan.chunk, plan.chunk) for t in rows)
            capped = soft_capped(logits, plan.soft_cap)
            weights = _weights(capped, allowed, statistics, scale)  # (batch, heads, chunk, width)
            keys, values = (steps.rows(t, start, plan.band_width) for t in (key, value))
            logits_grad = _logits_gradient(weights, values, output_gradient, delta)  # (batch, heads, chunk, width)
            logits_grad = streaming_softmax.cap_gradient(logits_grad, capped, plan.soft_cap)
            return tf.matmul(logits_grad, keys)  # (batch, heads, chunk, depth)

        may_share = strided_layout.band_may_share(
            masks, index * plan.chunk, plan.chunk, strided_layout.band_start(plan, index), plan.band_width
        )

        def skipped():
            return _zero_rows(query, [plan.chunk, query.shape[-1]])

        return index + 1, query_grads.write(index, document_blocks.guarded(may_share, computed, skipped))

    query_grads = tf.while_loop(
        lambda index, *_: index < plan.num_chunks,
        step,
        (0, steps.step_array(query, plan.num_chunks, plan.chunk, query.shape[-1])),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )[1]
    return steps.unstack_steps(query_grads.stack())[:, :, : plan.query_len]


def _band_key_gradients(plan, masks, scale, inputs, rows):
    """The band part's `dZ^T Q` and value gradient, chunk by chunk of keys, each over its slice of
    `band_query_width` queries (chunk-padded): `(batch, heads, key_len, d)` each."""
    query, key, value = inputs
    key, value = (strided_layout.pad_key_chunks(plan, t) for t in (key, value))

    def step(index, key_grads, value_grads):
        start = tf.gather(tf.constant(plan.band_query_starts, tf.int32), index)
        width = plan.band_query_width
        first_key = index * plan.key_chunk

        def computed():
            keys, values = (steps.rows(t, first_key, plan.key_chunk) for t in (key, value))  # (b, h, key_chunk, d)
            queries = steps.rows(query, start, width)  # (batch, heads, width, depth)
            output_gradient, delta, statistics = (steps.rows(t, start, width) for t in rows)
            logits = tf.matmul(queries, keys, transpose_b=True)  # (batch, heads, width, key_chunk)
            allowed = strided_layout.band_allowed(plan, masks, start, width, first_key, plan.key_chunk)
            capped = soft_capped(logits, plan.soft_cap)
            weights = _weights(capped, allowed, statistics, scale)  # (batch, heads, width, key_chunk)
            logits_grad = _logits_gradient(weights, values, output_gradient, delta)  # (b, h, width, key_chunk)
            logits_grad = streaming_softmax.cap_gradient(logits_grad, capped, plan.soft_cap)
            return (
                tf.matmul(logits_grad, queries, transpose_a=True),  # (batch, heads, key_chunk, depth)
                tf.matmul(weights, output_gradient, transpose_a=True),  # (batch, heads, key_chunk, dv)
            )

        def skipped():
            return tuple(_zero_rows(query, [plan.key_chunk, t.shape[-1]]) for t in (key, value))

        may_share = strided_layout.band_may_share(masks, start, width, first_key, plan.key_chunk)
        key_grad, value_grad = document_blocks.guarded(may_share, computed, skipped)
        return index + 1, key_grads.write(index, key_grad), value_grads.write(index, value_grad)

    arrays = tf.while_loop(
        lambda index, *_: index < plan.num_key_chunks,
        step,
        (
            0,
            steps.step_array(query, plan.num_key_chunks, plan.key_chunk, key.shape[-1]),
            steps.step_array(query, plan.num_key_chunks, plan.key_chunk, value.shape[-1]),
        ),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )[1:]
    return [steps.unstack_steps(array.stack())[:, :, : plan.key_len] for array in arrays]


def _strided_backward(plan, masks, scale, inputs, rows):
    query, key, value = inputs
    query_grid = strided_layout.to_grid(
        query, plan.front, plan.query_rows, plan.stride
    )  # (batch, heads, stride, u, depth)
    key_grid, value_grid = (
        strided_layout.to_grid(t, 0, plan.key_rows, plan.stride) for t in (key, value)
    )  # (b, h, s, m, d)
    row_grids = [strided_layout.to_grid(t, plan.front, plan.query_rows, plan.stride) for t in rows]  # (b, h, s, u, ·)

    def step(index, query_grads, key_grads, value_grads):
        def computed():
            queries, keys, logits, allowed = strided_layout.grid_block(plan, masks, index, query_grid, key_grid)
            first = index * plan.residues_per_step
            output_gradient, delta, statistics = (steps.rows(t, first, plan.residues_per_step) for t in row_grids)
            capped = soft_capped(logits, plan.soft_cap)
            weights = _weights(capped, allowed, statistics, scale)  # (batch, heads, per_step, u, m)
            values = steps.rows(value_grid, first, plan.residues_per_step)
            return _block_gradients(weights, capped, plan.soft_cap, (queries, keys), values, output_gradient, delta)

        def skipped():
            per_step = plan.residues_per_step
            return (
                _zero_rows(query, [per_step, plan.query_rows, query.shape[-1]]),
                _zero_rows(query, [per_step, plan.key_rows, key.shape[-1]]),
                _zero_rows(query, [per_step, plan.key_rows, value.shape[-1]]),
            )

        grads = document_blocks.guarded(strided_layout.grid_may_share(plan, masks, index), computed, skipped)
        arrays = (query_grads, key_grads, value_grads)
        return (index + 1, *(array.write(index, grad) for array, grad in zip(arrays, grads)))

    arrays = tf.while_loop(
        lambda index, *_: index < plan.num_steps,
        step,
        (
            0,
            steps.step_array(query, plan.num_steps, plan.residues_per_step, plan.query_rows, query.shape[-1]),
            steps.step_array(query, plan.num_steps, plan.residues_per_step, plan.key_rows, key.shape[-1]),
            steps.step_array(query, plan.num_steps, plan.residues_per_step, plan.key_rows, value.shape[-1]),
        ),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )[1:]
    query_grad, key_grad, value_grad = (steps.unstack_steps(array.stack()) for array in arrays)
    return [
        strided_layout.from_grid(query_grad, plan.front, plan.query_len),
        strided_layout.from_grid(key_grad, 0, plan.key_len),
        strided_layout.from_grid(value_grad, 0, plan.key_len),
    ]
