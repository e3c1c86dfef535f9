"""Memory-efficient (blockwise) scaled dot-product attention for the TensorFlow backend.

The same contract as `keras_attn.dispatch.attention.scaled_dot_product_attention` (masks, causal, sliding
window, bias, dropout on the normalised weights, fully masked rows give exactly zero) without
ever holding the `(query_len, key_len)` attention matrix:

- queries are processed in chunks of `query_block_size`; for each chunk a loop over key blocks of
  `key_block_size` keeps a running maximum and a running sum of the softmax (the "online softmax"
  of Milakov & Gimelshein 2018, Rabe & Staats 2021, FlashAttention);
- key blocks that the attention pattern (`keras_attn.patterns`) excludes are skipped, not
  computed (`pattern.key_range` / `pattern.query_range`);
- in packed rows (segment ids, `keras_attn.core.segments`) each block is masked by the documents
  of its own queries and keys, and the blocks in which no query shares a document with a key are
  skipped too (`keras_attn.kernels.document_blocks`): a row of documents costs about the sum of
  their squared lengths, and no `(query_len, key_len)` document mask is ever built;
- the backward pass (a `tf.custom_gradient`) stores only the output and the per-row log-sum-exp
  and recomputes each block's weights, so training memory is linear in the length too;
- dropout masks come from a stateless generator keyed by block, so the backward pass regenerates
  exactly the masks of the forward pass;
- a position bias (`keras_attn.core.position_bias`: ALiBi, T5's relative bias) is computed per block
  from the block's positions, in the forward pass and again in the backward pass, where each
  block's logits gradient gives its parameters' gradient.

Peak memory is `O(batch * heads * (length * depth + query_block_size * key_block_size))`.
Loops are `tf.while_loop`s over static block sizes: they work eagerly, in `tf.function` and under
`jit_compile=True`, and long lengths never unroll.

The online softmax is `keras_attn.kernels.streaming_softmax`'s: the inverse temperature multiplies logits
shifted by the row's running maximum (exact up to the float32 limit), masked keys have weight
exactly 0, and a row that never meets an allowed key gets a zero output, as in the dense path.
Logits are float32 whatever the compute dtype.
"""

import dataclasses

import keras
import tensorflow as tf

from keras_attn import patterns
from keras_attn.core.position_bias import add_gradients
from keras_attn.core.position_bias import bias_parameter_gradients
from keras_attn.core.position_bias import check_position_bias
from keras_attn.core.position_bias import read_bias_parameters
from keras_attn.core.position_bias import split_inputs
from keras_attn.core.segments import resolve_segment_ids
from keras_attn.core.softmax import resolved_scale
from keras_attn.kernels import blockwise_plan
from keras_attn.kernels import cost
from keras_attn.kernels import document_blocks
from keras_attn.kernels import steps
from keras_attn.kernels import streaming_softmax
from keras_attn.kernels.call import why_not_tensorflow_streaming
from keras_attn.kernels.call import with_repeated_heads
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_scale

# Loop iterations run one at a time: TensorFlow would otherwise run up to 10 iterations of each
# nested loop ahead (100 blocks' temporaries at once), and peak memory would grow with length.
_PARALLEL_ITERATIONS = 1


def why_unsupported(call):
    """Why the blockwise kernel cannot take this `AttentionCall` (a message), or `None` when it can."""
    streaming = why_not_tensorflow_streaming(call)
    if streaming:
        return streaming
    if 0 in (call.query.shape[1], call.key.shape[1]):  # XLA compiles a block's slice even when no block runs
        return f"at least one query and one key. Received: query.shape={tuple(call.query.shape)}, key.shape={tuple(call.key.shape)}"
    return None


def attend(call):
    """`blockwise_attention` of an `AttentionCall`, with the default block sizes, its grouped key/value heads repeated to the query's."""
    call = with_repeated_heads(call)
    return blockwise_attention(
        call.query,
        call.key,
        call.value,
        mask=call.mask,
        bias=call.bias,
        pattern=call.pattern,
        query_offset=call.query_offset,
        scale=call.scale,
        dropout_rate=call.dropout_rate,
        training=call.dropout_rate > 0.0,
        seed_generator=call.seed_generator,
        position_bias=call.position_bias,
        query_segment_ids=call.query_segment_ids,
        key_segment_ids=call.key_segment_ids,
        logit_soft_cap=call.logit_soft_cap,
    )


def cost_features(call):
    """The `keras_attn.kernels.cost` features of a call this kernel takes: each query block computes
    the key blocks its pattern reaches, one block per loop step, holding one block's logits at a
    time (the backward pass recomputes them). Packed rows count as one document (the blocks skipped
    between documents depend on the data)."""
    _, query_len, key_len, _, _, _ = cost.sizes(call)
    plan = blockwise_plan.BlockPlan(
        query_len=query_len,
        key_len=key_len,
        query_block=blockwise_plan.clamp_block(blockwise_plan.default_block_size(query_len), query_len),
        key_block=blockwise_plan.clamp_block(blockwise_plan.default_block_size(key_len), key_len),
        pattern=call.pattern,
        query_offset=call.query_offset if isinstance(call.query_offset, int) else 0,
        dropout_rate=call.dropout_rate,
    )
    indices, weight = cost.sampled_blocks(plan.num_query_blocks)
    ranges = [plan.key_blocks_for(query_block) for query_block in indices]
    blocks = round(weight * sum(max(0, stop - start) for start, stop in ranges))
    block_pairs = plan.query_block * plan.key_block
    return cost.features(call, computed_pairs=blocks * block_pairs, steps=blocks, held_pairs=block_pairs)


def blockwise_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    pattern=None,
    is_causal=False,
    sliding_window=None,
    query_offset=0,
    scale=None,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    query_block_size=None,
    key_block_size=None,
    position_bias=None,
    query_segment_ids=None,
    key_segment_ids=None,
    logit_soft_cap=None,
):
    """Blockwise attention with an online softmax; memory linear in the sequence length.

    Called by `scaled_dot_product_attention(..., implementation="blockwise")`, which validates
    the inputs, repeats grouped key/value heads and resolves `scale` first; the arguments mean
    the same as there.

    Args:
        query: `(batch, query_len, heads, depth)`.
        key: `(batch, key_len, heads, depth)`.
        value: `(batch, key_len, heads, value_depth)`.
        mask: optional boolean mask broadcastable to `(batch, heads, query_len, key_len)`.
        bias: optional additive bias broadcastable to `(batch, heads, query_len, key_len)`;
            differentiable.
        pattern: optional `keras_attn.patterns.Pattern`; query `i` sits at position
            `i + query_offset`. Key blocks outside `pattern.key_range` are never computed.
        is_causal, sliding_window: shorthands intersected with `pattern`
            (`keras_attn.patterns.from_shorthands`).
        query_offset: position of the first query among the keys (int or scalar int tensor).
        scale: the inverse temperature multiplying the logits; `None` (default) for
            `keras_attn.core.softmax.default_scale`, `1 / sqrt(depth)`.
        dropout_rate: dropout on the normalised attention weights when `training`.
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for dropout.
        query_block_size: queries per chunk (static int); by default about `query_len / 16`,
            a power of two between `blockwise_plan.MIN_DEFAULT_BLOCK_SIZE` and
            `blockwise_plan.MAX_DEFAULT_BLOCK_SIZE`.
        key_block_size: keys per block (static int); the same default over `key_len`.
        position_bias: optional `keras_attn.core.position_bias.PositionBias` for the query heads;
            its bias is computed per block from positions (query `i` at `i + query_offset`).
        query_segment_ids, key_segment_ids: optional int `(batch, query_len)` / `(batch, key_len)`
            document ids of packed rows (`keras_attn.core.segments`, 0 for padding), together: a
            query sees only keys of its own non-zero document, and blocks in which no query shares
            a document with a key are never computed (`keras_attn.kernels.document_blocks`).
        logit_soft_cap: optional positive number: logits `tanh(scale * Q K^T / cap) * cap`
            before the biases and the mask (`keras_attn.core.softmax.soft_capped`).

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype of `value`; fully masked rows are 0.

    Example:

    >>> from keras_attn.patterns import Causal
    >>> q = k = v = keras.random.normal((1, 4096, 8, 32))
    >>> out = blockwise_attention(q, k, v, pattern=Causal(), scale=32 ** -0.5)
    >>> out.shape
    TensorShape([1, 4096, 8, 32])
    """
    check_scale(scale)  # called directly too: a scale past float32 would make every logit inf
    scale = resolved_scale(scale, query.shape[-1])
    pattern = patterns.from_shorthands(pattern, is_causal, sliding_window)
    position_bias = check_position_bias(position_bias, query.shape[2])
    for name, size in (("query_block_size", query_block_size), ("key_block_size", key_block_size)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(f"`{name}` must be None or a positive integer. Received: {name}={size!r}")
    query_len, key_len = blockwise_plan.length(query), blockwise_plan.length(key)
    query_block_size = query_block_size or blockwise_plan.default_block_size(query_len)
    key_block_size = key_block_size or blockwise_plan.default_block_size(key_len)
    plan = blockwise_plan.BlockPlan(
        query_len=query_len,
        key_len=key_len,
        query_block=blockwise_plan.clamp_block(query_block_size, query_len),
        key_block=blockwise_plan.clamp_block(key_block_size, key_len),
        pattern=pattern,
        query_offset=query_offset if isinstance(query_offset, int) else tf.cast(query_offset, "int32"),
        dropout_rate=dropout_rate if training else 0.0,
        position_bias=position_bias,
        has_bias=bias is not None,
        soft_cap=logit_soft_cap,
    )
    plan = _with_documents(plan, query_segment_ids, key_segment_ids, query.shape[1], key.shape[1])
    seed = None
    if plan.dropout_rate > 0.0:
        seed = keras.random.randint((2,), 0, 2**31 - 1, dtype="int32", seed=seed_generator)
    # Logits in float32 whatever the compute dtype: float16 products overflow at 65,504.
    dtype = float_math_dtype(query.dtype)
    query, scale = streaming_softmax.fold_scale(tf.cast(query, dtype), scale, logit_soft_cap)  # (b, len, h, d)
    scale = None if scale is None else tf.convert_to_tensor(scale, dtype)
    key = tf.cast(key, dtype)
    # (batch, heads, padded_len, depth): one transpose per tensor, the blocks are then contiguous.
    query = blockwise_plan.to_blocks_layout(query, plan.padded_query_len - query_len)
    key = blockwise_plan.to_blocks_layout(key, plan.padded_key_len - key_len)
    value = blockwise_plan.to_blocks_layout(value, plan.padded_key_len - key_len)
    mask = None if mask is None else blockwise_plan.pad_pairwise(tf.cast(mask, "bool"), plan, False)
    inputs = (query, key, value)
    if bias is not None:
        inputs += (blockwise_plan.pad_pairwise(tf.cast(bias, float_math_dtype(query.dtype)), plan, 0),)
    inputs += read_bias_parameters(position_bias)
    output = streaming_softmax.custom_gradient(  # the gradient recomputes blocks
        lambda scale, *inputs: _forward(plan, mask, seed, scale, *split_inputs(inputs, plan.has_bias)),
        lambda scale, inputs, output, statistics, output_gradient: _backward(
            plan, mask, seed, scale, inputs, output, statistics, output_gradient
        ),
        scale,
        inputs,
    )
    output = tf.transpose(output[:, :, :query_len], (0, 2, 1, 3))  # (batch, query_len, heads, dv)
    return tf.cast(output, value.dtype)


def _with_documents(plan, query_segment_ids, key_segment_ids, query_len, key_len):
    """The plan with the `DocumentBlocks` of the call's segment ids (validated); unchanged without them."""
    query_ids, key_ids = resolve_segment_ids(None, query_segment_ids, key_segment_ids, query_len, key_len)
    if query_ids is None:
        return plan
    documents = document_blocks.document_blocks(
        query_ids, key_ids, plan.query_block, plan.key_block, plan.padded_query_len, plan.padded_key_len
    )
    return dataclasses.replace(plan, documents=documents)


def _exclude_masked_block(plan, mask, query_block, key_block, logits):
    """`streaming_softmax.exclude` on one block's raw logits, skipped where no mask reaches.

    Blocks the pattern fully allows (most of them at long lengths) need no masking; they
    are told apart at run time, so only the diagonal and edge blocks pay for it.
    """
    if mask is None and plan.pattern is None and plan.documents is None and not plan.pads_keys:
        return logits

    def masked():
        return streaming_softmax.exclude(logits, blockwise_plan.block_mask(plan, mask, query_block, key_block))

    if mask is not None:
        return masked()
    return tf.cond(plan.block_unmasked(query_block, key_block), lambda: logits, masked)


def _block_logits(plan, mask, query_block, key_block, query, key):
    """Raw logits `(batch, heads, q_block, k_block)` of one block (soft-capped with the plan's cap), `-inf` where masked."""
    logits = streaming_softmax.raw_logits(query, key, plan.soft_cap)  # (batch, heads, q_block, k_block)
    return _exclude_masked_block(plan, mask, query_block, key_block, logits)


def _block_bias(plan, bias, parameters, query_block, key_block):
    """The additive bias of one block (`bias=` and the position bias), or `None` without one."""
    total = None if bias is None else blockwise_plan.pairwise_block(bias, plan, query_block, key_block)
    if plan.position_bias is not None:
        position = plan.position_bias.block_bias(parameters, *plan.positions(query_block, key_block))  # (1, h, q, k)
        total = position if total is None else total + tf.cast(position, total.dtype)
    return total


def _dropout_keep_scale(plan, seed, query_block, key_block, shape, dtype):
    """`keep / (1 - rate)` for one block, regenerated identically in the backward pass."""
    block_seed = tf.random.experimental.stateless_fold_in(seed, query_block * plan.num_key_blocks + key_block)
    keep = tf.random.stateless_uniform(shape, seed=block_seed) >= plan.dropout_rate
    return tf.cast(keep, dtype) / (1.0 - plan.dropout_rate)


def _forward(plan, mask, seed, scale, query, key, value, bias, parameters):
    """Output `(batch, heads, padded_q, value_depth)` and each row's softmax statistics
    `(batch, heads, padded_q, 2)`: its largest raw logit `M` and log-normaliser `L`."""
    dtype = float_math_dtype(query.dtype)

    def query_chunk(query_block, outputs, row_statistics):
        chunk = steps.block_rows(query, query_block, plan.query_block)  # (batch, heads, q_block, depth)
        batch, heads = keras.ops.shape(query)[:2]

        def key_step(key_block, accumulator, *statistics):
            keys = steps.block_rows(key, key_block, plan.key_block)  # (batch, heads, k_block, depth)
            logits = _block_logits(plan, mask, query_block, key_block, chunk, keys)
            block_bias = _block_bias(plan, bias, parameters, query_block, key_block)
            statistics, weights, factor = streaming_softmax.update(
                _statistics(statistics), logits, scale, block_bias
            )  # weights: (batch, heads, q_block, k_block)
            if plan.dropout_rate > 0.0:
                weights *= _dropout_keep_scale(plan, seed, query_block, key_block, tf.shape(weights), dtype)
            values = steps.block_rows(value, key_block, plan.key_block)  # (batch, heads, k_block, value_depth)
            update = tf.matmul(tf.cast(weights, value.dtype), values)  # (batch, heads, q_block, dv)
            accumulator = factor * accumulator + tf.cast(update, dtype)
            return key_block + 1, accumulator, *_loop_state(statistics)

        start, stop = plan.key_blocks_for(query_block)
        empty = streaming_softmax.RowStatistics.empty(
            tf.stack([batch, heads, plan.query_block, 1]), dtype, plan.has_any_bias
        )
        accumulator = tf.zeros(tf.stack([batch, heads, plan.query_block, value.shape[-1]]), dtype)
        _, accumulator, *statistics = tf.while_loop(
            lambda key_block, *_: key_block < stop,
            key_step,
            (start, accumulator, *_loop_state(empty)),
            parallel_iterations=_PARALLEL_ITERATIONS,
        )
        statistics = _statistics(statistics)
        output = streaming_softmax.normalised(statistics, accumulator)  # rows without keys: 0
        stored = tf.concat([statistics.row_max, statistics.log_normaliser()], -1)  # (batch, heads, q_block, 2)
        return query_block + 1, outputs.write(query_block, output), row_statistics.write(query_block, stored)

    outputs = steps.step_array(query, plan.num_query_blocks, plan.query_block, value.shape[-1], dtype=dtype)
    row_statistics = steps.step_array(query, plan.num_query_blocks, plan.query_block, 2, dtype=dtype)
    _, outputs, row_statistics = tf.while_loop(
        lambda query_block, *_: query_block < plan.num_query_blocks,
        query_chunk,
        (0, outputs, row_statistics),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )
    return steps.unstack_steps(outputs.stack()), steps.unstack_steps(row_statistics.stack())


def _loop_state(statistics):
    """`RowStatistics` as `tf.while_loop` variables (its `shift` only with a bias)."""
    return tuple(t for t in (statistics.row_max, statistics.total, statistics.shift) if t is not None)


def _statistics(loop_state):
    """The inverse of `_loop_state`."""
    row_max, total, *shift = loop_state
    return streaming_softmax.RowStatistics(row_max, shift[0] if shift else None, total)


def _backward(plan, mask, seed, scale, inputs, output, row_statistics, output_gradient):
    """Gradients of [`scale` and] `inputs` (query, key, value[, bias][, bias parameters]) recomputed
    block by block: the logits `z = scale * (Q K^T - M) + bias` get `dZ`, the raw logits `scale * dZ`
    (`scale=None`: folded into the query, whose gradient carries it outside)."""
    query, key, value, bias, parameters = split_inputs(inputs, plan.has_bias)
    dtype = float_math_dtype(query.dtype)
    output_gradient = tf.cast(output_gradient, dtype)  # (batch, heads, padded_q, value_depth)
    # rowsum(dO * O) = sum_k P_k dP_k, the subtracted term of the softmax gradient.
    delta = tf.reduce_sum(output_gradient * output, -1, keepdims=True)  # (batch, heads, padded_q, 1)
    query_f, key_f, value_f = (tf.cast(t, dtype) for t in (query, key, value))

    def key_block_step(key_block, key_grads, value_grads, query_grads, bias_grads, scale_grad, parameter_grads):
        keys = steps.block_rows(key_f, key_block, plan.key_block)  # (batch, heads, k_block, depth)
        values = steps.block_rows(value_f, key_block, plan.key_block)  # (batch, heads, k_block, value_depth)

        def query_step(query_block, key_grad, value_grad, query_grads, bias_grads, scale_grad, parameter_grads):
            chunk = steps.block_rows(query_f, query_block, plan.query_block)  # (batch, heads, q_block, depth)
            chunk_grad = steps.block_rows(output_gradient, query_block, plan.query_block)  # (b, h, q_block, dv)
            logits = _block_logits(plan, mask, query_block, key_block, chunk, keys)
            stored = steps.block_rows(row_statistics, query_block, plan.query_block)  # (batch, heads, q_block, 2)
            weights = streaming_softmax.weights(
                logits,
                scale,
                stored[..., :1],
                stored[..., 1:],
                _block_bias(plan, bias, parameters, query_block, key_block),
            )  # (batch, heads, q_block, k_block), normalised; 0 where masked
            weights_grad = tf.matmul(chunk_grad, values, transpose_b=True)  # (b, h, q_block, k_block)
            dropped = weights
            if plan.dropout_rate > 0.0:
                keep_scale = _dropout_keep_scale(plan, seed, query_block, key_block, tf.shape(weights), dtype)
                dropped, weights_grad = weights * keep_scale, weights_grad * keep_scale
            value_grad += tf.matmul(dropped, chunk_grad, transpose_a=True)  # (b, h, k_block, dv)
            row_delta = steps.block_rows(delta, query_block, plan.query_block)  # (batch, heads, q_block, 1)
            logits_grad = streaming_softmax.logits_gradient(weights, weights_grad, row_delta)  # dZ: (b, h, q, k)
            raw_grad = streaming_softmax.cap_gradient(logits_grad, logits, plan.soft_cap)  # through the cap
            key_grad += streaming_softmax.times_scale(
                scale, tf.matmul(raw_grad, chunk, transpose_a=True)
            )  # (b, h, k, d)
            query_side = tf.matmul(raw_grad, keys)  # dZ K: (batch, heads, q_block, depth)
            if scale is not None:
                scale_grad += streaming_softmax.scale_gradient(chunk, query_side)
            query_grad = query_grads.read(query_block) + streaming_softmax.times_scale(scale, query_side)
            query_grads = query_grads.write(query_block, query_grad)
            if bias is not None:
                bias_grads = blockwise_plan.accumulate_bias_grad(
                    plan, bias, bias_grads, query_block, key_block, logits_grad
                )
            parameter_grads = add_gradients(
                parameter_grads,
                bias_parameter_gradients(
                    plan.position_bias, parameters, *plan.positions(query_block, key_block), logits_grad
                ),
            )
            return query_block + 1, key_grad, value_grad, query_grads, bias_grads, scale_grad, parameter_grads

        start, stop = plan.query_blocks_for(key_block)
        _, key_grad, value_grad, query_grads, bias_grads, scale_grad, parameter_grads = tf.while_loop(
            lambda query_block, *_: query_block < stop,
            query_step,
            (start, tf.zeros_like(keys), tf.zeros_like(values), query_grads, bias_grads, scale_grad, parameter_grads),
            parallel_iterations=_PARALLEL_ITERATIONS,
        )
        return (
            key_block + 1,
            key_grads.write(key_block, key_grad),
            value_grads.write(key_block, value_grad),
            query_grads,
            bias_grads,
            scale_grad,
            parameter_grads,
        )

    query_grads = steps.zero_step_array(query_f, plan.num_query_blocks, plan.query_block)
    bias_grads = blockwise_plan.zero_bias_grad_blocks(plan, bias) if bias is not None else tf.zeros(())
    key_grads = steps.step_array(key, plan.num_key_blocks, plan.key_block, key.shape[-1], dtype=dtype)
    value_grads = steps.step_array(key, plan.num_key_blocks, plan.key_block, value.shape[-1], dtype=dtype)
    parameter_grads = tuple(tf.zeros_like(parameter) for parameter in parameters)
    _, key_grads, value_grads, query_grads, bias_grads, scale_grad, parameter_grads = tf.while_loop(
        lambda key_block, *_: key_block < plan.num_key_blocks,
        key_block_step,
        (0, key_grads, value_grads, query_grads, bias_grads, tf.zeros((), dtype), parameter_grads),
        parallel_iterations=_PARALLEL_ITERATIONS,
    )
    grads = [] if scale is None else [scale_grad]
    grads += [
        tf.cast(steps.unstack_steps(query_grads.stack()), query.dtype),
        tf.cast(steps.unstack_steps(key_grads.stack()), key.dtype),
        tf.cast(steps.unstack_steps(value_grads.stack()), value.dtype),
    ]
    if bias is not None:
        grads.append(tf.cast(blockwise_plan.unblock_bias_grad(plan, bias, bias_grads.stack()), bias.dtype))
    return grads + list(parameter_grads)
