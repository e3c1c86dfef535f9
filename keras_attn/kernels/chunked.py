"""Query-chunked scaled dot-product attention for patterned attention (TensorFlow backend).

The same contract as `keras_attn.core.attention.scaled_dot_product_attention` (masks, patterns, bias,
dropout on the normalised weights, fully masked rows give exactly zero) for attention whose
`keras_attn.patterns` pattern leaves part of the `(query_len, key_len)` matrix out: the queries
run in chunks, and each chunk computes only the keys `pattern.key_range` says it can reach (about
half the work of the dense path under a causal pattern).

The gradient is written out (a `tf.custom_gradient`) instead of being differentiated through the
softmax: each chunk keeps its weights from the forward pass, and the softmax gradient subtracts
`rowsum(dO * O)` (FlashAttention's `delta`, a pass over the output) rather than reducing the
product of the weights and their gradient. Those passes over the weights are what the step is
made of at depth 32 (benchmarks/layer_throughput.py). Memory is that of the dense weights,
inside the band; long sequences go to `keras_attn.kernels.blockwise` (linear memory).

A position bias (`keras_attn.core.position_bias`: ALiBi, T5's relative bias) is computed per chunk
from the chunk's positions, and its parameters get their gradient from each chunk's logits
gradient.

Each chunk holds whole rows. An inverse temperature of at most 1 is folded into the query
(`keras_attn.kernels.streaming_softmax.fold_scale`) and the chunk's softmax is the core's
(`keras_attn.core.softmax`: finite fill, one fused softmax); a larger or tensor one multiplies logits
already shifted by their row maximum (`keras_attn.kernels.streaming_softmax.softmax`, exact up to the
float32 limit). Either way masked keys have weight exactly 0 and rows without keys a zero output.
"""

import dataclasses

import keras
import tensorflow as tf

from keras_attn import patterns
from keras_attn.core.masks import may_empty_rows
from keras_attn.core.masks import pattern_mask
from keras_attn.core.position_bias import add_gradients
from keras_attn.core.position_bias import bias_parameter_gradients
from keras_attn.core.position_bias import block_positions
from keras_attn.core.position_bias import check_position_bias
from keras_attn.core.position_bias import read_bias_parameters
from keras_attn.core.position_bias import split_inputs
from keras_attn.core.segments import with_segments_as_mask
from keras_attn.core.softmax import fill_masked
from keras_attn.core.softmax import masked_softmax
from keras_attn.core.softmax import resolved_scale
from keras_attn.kernels import streaming_softmax
from keras_attn.kernels.call import why_not_tensorflow_streaming
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_scale

# Queries per chunk: each chunk computes only the keys its pattern reaches.
QUERY_CHUNK_SIZE = 128


@dataclasses.dataclass(frozen=True)
class QueryChunk:
    """Queries `[query_start, query_stop)` attend to keys `[key_start, key_stop)` (static ints)."""

    query_start: int
    query_stop: int
    key_start: int
    key_stop: int

    @property
    def has_keys(self):
        return self.key_stop > self.key_start


def why_unsupported(call):
    """Why the chunked kernel cannot take this `AttentionCall` (a message), or `None` when it can."""
    streaming = why_not_tensorflow_streaming(call)
    if streaming:
        return streaming
    query, key = call.query, call.key
    if query.shape[1] is None or key.shape[1] is None:
        return f"static lengths. Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
    if isinstance(call.query_offset, bool) or not isinstance(call.query_offset, int):
        return f"a Python int `query_offset`. Received: query_offset={call.query_offset!r}"
    for name, pairwise in (("mask", call.mask), ("bias", call.bias)):
        if pairwise is not None and None in tuple(pairwise.shape)[2:]:
            return f"`{name}` with static query and key dimensions. Received: {name}.shape={tuple(pairwise.shape)}"
    return None


def attend(call):
    """`chunked_attention` of an `AttentionCall`, in chunks of `QUERY_CHUNK_SIZE` queries."""
    call = with_segments_as_mask(call)
    return chunked_attention(
        call.query,
        call.key,
        call.value,
        mask=call.mask,
        bias=call.bias,
        pattern=call.pattern,
        query_offset=call.query_offset,
        scale=call.scale,
        dropout_rate=call.dropout_rate,
        seed_generator=call.seed_generator,
        chunk_size=QUERY_CHUNK_SIZE,
        position_bias=call.position_bias,
    )


def pattern_query_chunks(query_len, key_len, chunk_size, pattern, query_offset=0):
    """Splits the queries into chunks of `chunk_size` and bounds each chunk's keys by `pattern.key_range`.

    Under a causal pattern chunk `i` needs only the keys up to its last query, so the chunks cover
    about half of the `(query_len, key_len)` matrix; a sliding window bounds both ends. Without a
    pattern (`None`) every chunk attends to every key.
    """
    chunks = []
    for query_start in range(0, query_len, chunk_size):
        query_stop = min(query_start + chunk_size, query_len)
        # positions of the chunk's first and last queries among the keys
        key_start, key_stop = (
            (0, key_len)
            if pattern is None
            else pattern.key_range(query_start + query_offset, query_stop - 1 + query_offset, key_len)
        )
        chunks.append(QueryChunk(query_start, query_stop, key_start, key_stop))
    return chunks


def chunked_attention(
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
    seed_generator=None,
    chunk_size=QUERY_CHUNK_SIZE,
    position_bias=None,
):
    """Attention of `pattern_query_chunks` chunks, each over only the keys its pattern reaches.

    Args:
        query: `(batch, query_len, heads, depth)`, static `query_len`.
        key: `(batch, key_len, heads, depth)`, static `key_len` (key/value heads already
            repeated to the query heads).
        value: `(batch, key_len, heads, value_depth)`.
        mask: optional boolean mask broadcastable to `(batch, heads, query_len, key_len)` with
            static query and key dimensions.
        bias: optional additive bias, same shape rules as `mask`; it receives a gradient.
        pattern: a `keras_attn.patterns.Pattern` or `None`; query `i` sits at position `i + query_offset`.
        is_causal, sliding_window: shorthands intersected with `pattern`
            (`keras_attn.patterns.from_shorthands`); without any, every chunk attends to every key.
        query_offset: Python int position of the first query among the keys.
        scale: the inverse temperature multiplying the logits; `None` (default) for
            `keras_attn.core.softmax.default_scale`, `1 / sqrt(depth)`.
        dropout_rate: dropout on the normalised weights (pass 0 outside training).
        seed_generator: a `keras.random.SeedGenerator` for dropout.
        chunk_size: queries per chunk.
        position_bias: optional `keras_attn.core.position_bias.PositionBias` for the query heads;
            its bias is computed per chunk from positions (query `i` at `i + query_offset`).

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype of `value`.
    """
    check_scale(scale)  # called directly too: a scale past float32 would make every logit inf
    scale = resolved_scale(scale, query.shape[-1])
    pattern = patterns.from_shorthands(pattern, is_causal, sliding_window)
    position_bias = check_position_bias(position_bias, query.shape[2])
    query_len, key_len = query.shape[1], key.shape[1]
    chunks = pattern_query_chunks(query_len, key_len, chunk_size, pattern, query_offset)
    if mask is not None:
        mask = tf.convert_to_tensor(mask, tf.bool)
    chunk_masks = [
        pattern_mask(
            None if mask is None else _pairwise_slice(mask, chunk),
            pattern,
            chunk.query_stop - chunk.query_start,
            chunk.key_stop - chunk.key_start,
            query_offset=query_offset + chunk.query_start,
            key_offset=chunk.key_start,
        )
        for chunk in chunks
    ]
    # Logits in float32 whatever the compute dtype: float16 products overflow at 65,504.
    dtype = float_math_dtype(query.dtype)
    query, scale = streaming_softmax.fold_scale(tf.cast(query, dtype), scale)
    scale = None if scale is None else tf.convert_to_tensor(scale, dtype)
    query, key = (tf.transpose(tf.cast(t, dtype), (0, 2, 1, 3)) for t in (query, key))  # (batch, heads, len, depth)
    value = tf.transpose(value, (0, 2, 1, 3))  # (batch, heads, key_len, value_depth)
    plan = _ChunkPlan(
        chunks,
        chunk_masks,
        _keep_scales(chunks, query, dropout_rate, seed_generator),
        rows_may_be_empty=may_empty_rows(mask, pattern),
        key_len=key_len,
        has_bias=bias is not None,
        position_bias=position_bias,
        query_offset=query_offset,
    )
    inputs = (query, key, value) + (() if bias is None else (tf.convert_to_tensor(bias),))
    inputs += read_bias_parameters(position_bias)
    output = streaming_softmax.custom_gradient(  # (batch, heads, query_len, value_depth)
        lambda scale, *inputs: _forward(plan, scale, *split_inputs(inputs, plan.has_bias)),
        lambda scale, inputs, output, weights, output_gradient: _backward(
            plan, scale, inputs, output, weights, output_gradient
        ),
        scale,
        inputs,
    )
    return tf.transpose(output, (0, 2, 1, 3))  # (batch, query_len, heads, value_depth)


@dataclasses.dataclass(frozen=True)
class _ChunkPlan:
    """The chunks of one call with their merged masks and dropout keep-scales (`None`: none)."""

    chunks: list
    masks: list
    keep_scales: list
    rows_may_be_empty: bool
    key_len: int
    has_bias: bool
    position_bias: object
    query_offset: int

    def positions(self, chunk):
        """The query and key positions of a chunk, for its position bias."""
        return (
            block_positions(self.query_offset + chunk.query_start, chunk.query_stop - chunk.query_start),
            block_positions(chunk.key_start, chunk.key_stop - chunk.key_start),
        )


def _pairwise_slice(tensor, chunk):
    """A mask or bias `(batch | 1, heads | 1, query_len | 1, key_len | 1)` cut to the chunk."""
    rows = slice(None) if tensor.shape[2] == 1 else slice(chunk.query_start, chunk.query_stop)
    cols = slice(None) if tensor.shape[3] == 1 else slice(chunk.key_start, chunk.key_stop)
    return tensor[:, :, rows, cols]


def _keys(tensor, chunk):
    """Rows `[key_start, key_stop)` of a `(batch, heads, key_len, depth)` tensor."""
    return tensor[:, :, chunk.key_start : chunk.key_stop]


def _queries(tensor, chunk):
    """Rows `[query_start, query_stop)` of a `(batch, heads, query_len, depth)` tensor."""
    return tensor[:, :, chunk.query_start : chunk.query_stop]


def _keep_scales(chunks, query, dropout_rate, seed_generator):
    """Per chunk, `keep / (1 - rate)` of shape `(batch, heads, chunk_len, chunk_keys)`, or `None`.

    Drawn outside the custom gradient (the seed generator's state is a variable), so the backward
    pass applies exactly the forward masks.
    """
    if dropout_rate == 0.0:
        return [None] * len(chunks)
    batch, heads = tf.shape(query)[0], tf.shape(query)[1]
    dtype = float_math_dtype(query.dtype)

    def keep_scale(chunk):
        shape = tf.stack([batch, heads, chunk.query_stop - chunk.query_start, chunk.key_stop - chunk.key_start])
        return keras.random.dropout(tf.ones(shape, dtype), dropout_rate, seed=seed_generator)

    return [keep_scale(chunk) if chunk.has_keys else None for chunk in chunks]


def _chunk_bias(plan, chunk, bias, parameters):
    """The additive bias `(batch | 1, heads, chunk_len | 1, chunk_keys | 1)` of a chunk: `bias` and the position bias, or `None`."""
    total = None if bias is None else tf.cast(_pairwise_slice(bias, chunk), float_math_dtype(bias.dtype))
    if plan.position_bias is not None:
        position = tf.cast(
            plan.position_bias.block_bias(parameters, *plan.positions(chunk)), plan.position_bias.bias_dtype
        )
        total = position if total is None else total + tf.cast(position, total.dtype)
    return total


def _chunk_weights(plan, index, scale, query, key, bias, parameters):
    """Normalised float32 weights `(batch, heads, chunk_len, chunk_keys)` of chunk `index`; a row
    without keys gets zero weights, so a zero output and gradient."""
    chunk, mask = plan.chunks[index], plan.masks[index]
    logits = streaming_softmax.raw_logits(_queries(query, chunk), _keys(key, chunk))  # (b, h, chunk_len, chunk_keys)
    bias = _chunk_bias(plan, chunk, bias, parameters)
    bias = None if bias is None else tf.cast(bias, logits.dtype)
    if scale is not None:  # shift, then scale
        allowed = logits if mask is None else streaming_softmax.exclude(logits, mask)
        return streaming_softmax.softmax(allowed, scale, bias)[0]
    logits = logits if bias is None else logits + bias  # the scale is in the query
    if plan.rows_may_be_empty:
        return masked_softmax(logits, mask)
    return tf.nn.softmax(logits if mask is None else fill_masked(logits, mask))


def _forward(plan, scale, query, key, value, bias, parameters):
    """Output `(batch, heads, query_len, value_depth)` and each chunk's weights (`None`: no keys)."""
    outputs, chunk_weights = [], []
    batch, heads = tf.shape(query)[0], tf.shape(query)[1]
    for index, chunk in enumerate(plan.chunks):
        if not chunk.has_keys:  # the pattern masks every key of the chunk
            shape = tf.stack([batch, heads, chunk.query_stop - chunk.query_start, value.shape[-1]])
            outputs.append(tf.zeros(shape, value.dtype))
            chunk_weights.append(None)
            continue
        weights = _chunk_weights(plan, index, scale, query, key, bias, parameters)
        dropped = weights if plan.keep_scales[index] is None else weights * plan.keep_scales[index]
        outputs.append(tf.matmul(tf.cast(dropped, value.dtype), _keys(value, chunk)))  # (b, h, chunk_len, dv)
        chunk_weights.append(weights)
    return tf.concat(outputs, axis=2), chunk_weights  # (batch, heads, query_len, value_depth)


def _backward(plan, scale, inputs, output, chunk_weights, output_gradient):
    """Gradients of ([scale,] query, key, value[, bias][, bias parameters]) from each chunk's stored
    weights: the logits `z = scale * (Q K^T - M) + bias` get `dZ`, the raw logits `scale * dZ`
    (`scale=None`: folded into the query, whose gradient carries it outside)."""
    query, key, value, bias, parameters = split_inputs(inputs, plan.has_bias)
    parameter_grads = tuple(tf.zeros_like(parameter) for parameter in parameters)
    dtype = float_math_dtype(query.dtype)
    query_f, key_f, value_f, output_gradient = (tf.cast(t, dtype) for t in (query, key, value, output_gradient))
    # rowsum(dO * O) = sum_k P_k dP_k, the subtracted term of the softmax gradient.
    delta = tf.reduce_sum(output_gradient * tf.cast(output, dtype), -1, keepdims=True)  # (batch, heads, q, 1)
    with_dropout = any(keep_scale is not None for keep_scale in plan.keep_scales)
    if not with_dropout:
        # [dO, -delta] . [V, 1]^T = dP - delta: the subtraction rides on the matmul instead of
        # taking a pass over the weights (with dropout, dP is rescaled first and cannot).
        shifted_grad = tf.concat([output_gradient, -delta], -1)  # (batch, heads, q, value_depth + 1)
        shifted_values = tf.concat([value_f, tf.ones_like(value_f[..., :1])], -1)  # (batch, heads, k, dv + 1)
    query_grads, key_grads, value_grads, bias_grads, scale_grads = [], [], [], [], []
    for index, chunk in enumerate(plan.chunks):
        weights, keep_scale = chunk_weights[index], plan.keep_scales[index]
        if weights is None:
            query_grads.append(tf.zeros_like(_queries(query_f, chunk)))
            bias_grads.append(None)
            continue
        chunk_grad = _queries(output_gradient, chunk)  # (batch, heads, chunk_len, value_depth)
        if not with_dropout:
            dropped = weights
            shifted = tf.matmul(_queries(shifted_grad, chunk), _keys(shifted_values, chunk), transpose_b=True)
            logits_grad = weights * shifted  # (batch, heads, chunk_len, chunk_keys)
        else:
            dropped = weights * keep_scale
            weights_grad = tf.matmul(chunk_grad, _keys(value_f, chunk), transpose_b=True) * keep_scale
            logits_grad = weights * (weights_grad - _queries(delta, chunk))  # (b, h, chunk_len, chunk_keys)
        value_grads.append(_pad_keys(tf.matmul(dropped, chunk_grad, transpose_a=True), chunk, plan.key_len))
        query_side = tf.matmul(logits_grad, _keys(key_f, chunk))  # dZ K: (batch, heads, chunk_len, depth)
        if scale is not None:
            scale_grads.append(streaming_softmax.scale_gradient(_queries(query_f, chunk), query_side))
        query_grads.append(streaming_softmax.times_scale(scale, query_side))
        key_grad = tf.matmul(logits_grad, _queries(query_f, chunk), transpose_a=True)  # (b, h, chunk_keys, depth)
        key_grads.append(_pad_keys(streaming_softmax.times_scale(scale, key_grad), chunk, plan.key_len))
        bias_grads.append(logits_grad)
        parameter_grads = add_gradients(
            parameter_grads,
            bias_parameter_gradients(plan.position_bias, parameters, *plan.positions(chunk), logits_grad),
        )
    grads = [] if scale is None else [tf.add_n(scale_grads) if scale_grads else tf.zeros_like(scale)]
    grads += [
        tf.cast(tf.concat(query_grads, axis=2), query.dtype),
        tf.cast(tf.add_n(key_grads), key.dtype),
        tf.cast(tf.add_n(value_grads), value.dtype),
    ]
    if bias is not None:
        grads.append(tf.cast(_bias_gradient(plan, bias, bias_grads), bias.dtype))
    return grads + list(parameter_grads)


def _pad_keys(tensor, chunk, key_len):
    """A chunk's `(batch, heads, chunk_keys, depth)` key gradient placed among all `key_len` keys."""
    return tf.pad(tensor, [[0, 0], [0, 0], [chunk.key_start, key_len - chunk.key_stop], [0, 0]])


def _bias_gradient(plan, bias, logits_grads):
    """The gradient of a broadcast bias from each chunk's logits gradient (`None`: no keys)."""
    per_chunk = []
    for chunk, logits_grad in zip(plan.chunks, logits_grads):
        query_rows = 1 if bias.shape[2] == 1 else chunk.query_stop - chunk.query_start
        if logits_grad is None:
            shape = tf.stack([tf.shape(bias)[0], tf.shape(bias)[1], query_rows, tf.shape(bias)[3]])
            per_chunk.append(tf.zeros(shape, float_math_dtype(bias.dtype)))
            continue
        grad = streaming_softmax.broadcast_bias_gradient(bias, logits_grad)
        if bias.shape[3] != 1:
            grad = tf.pad(grad, [[0, 0], [0, 0], [0, 0], [chunk.key_start, plan.key_len - chunk.key_stop]])
        per_chunk.append(grad)
    if bias.shape[2] == 1:
        return tf.add_n(per_chunk)
    return tf.concat(per_chunk, axis=2)
