"""The dense attention kernel: the full `(query_len, key_len)` weights, the reference path.

It takes every input the dispatcher accepts (any backend, dynamic shapes, tensor offsets, returned
weights); the chunked and blockwise kernels compute the same function without materialising the
weights. The numerics (float32 logits and softmax, finite fill, exact zeros) are
`keras_attn.core.softmax`'s.
"""

import keras
from keras import ops

from keras_attn.core.masks import may_empty_rows
from keras_attn.core.masks import pattern_mask
from keras_attn.core.masks import zero_masked
from keras_attn.core.position_bias import check_position_bias
from keras_attn.core.segments import with_segments_as_mask
from keras_attn.core.softmax import attention_logits
from keras_attn.core.softmax import fill_masked
from keras_attn.core.softmax import mask_fill
from keras_attn.core.softmax import query_with_scale
from keras_attn.core.softmax import resolved_scale
from keras_attn.core.softmax import shifted_logits
from keras_attn.core.softmax import soft_capped
from keras_attn.core.softmax import softmax
from keras_attn.core.softmax import softmax_with_exact_saturated_gradient
from keras_attn.core.softmax import weighted_values
from keras_attn.kernels import cost
from keras_attn.kernels import single_query
from keras_attn.validation import check_scale


def why_unsupported(call):
    """The dense kernel takes every call: always `None`."""
    del call
    return None


def cost_features(call):
    """The `keras_attn.kernels.cost.Features` of a call: the whole `(query_len, key_len)` logits and
    weights in float32 in one step, the tensors Keras's layer holds in its compute dtype."""
    return cost.materialised(call, cost.FLOAT32_BYTES)


def attend(call):
    """`dense_attention` of an `AttentionCall`."""
    call = with_segments_as_mask(call)
    return dense_attention(
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
        return_weights=call.return_weights,
        hard=call.hard,
        position_bias=call.position_bias,
        logit_soft_cap=call.logit_soft_cap,
    )


def dense_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    pattern=None,
    query_offset=0,
    scale=None,
    dropout_rate=0.0,
    seed_generator=None,
    return_weights=False,
    hard=False,
    position_bias=None,
    logit_soft_cap=None,
):
    """Attention through the full `(query_len, key_len)` weights of `mask` merged with the pattern.

    Called by `scaled_dot_product_attention(..., implementation="dense")`, which validates the
    inputs and resolves `scale` first; the arguments mean the same as there, with `dropout_rate` the
    effective rate (pass 0 outside training). Grouped key/value heads are taken as they are
    (`attention_logits`, `weighted_values`): query head `h` attends with key/value head `h // groups`,
    the keys and values never repeated.

    The logits are `(scale * Q) K^T` for a Python `scale <= 1` (Keras's order; no pass over the
    logits), else `scale * (Q K^T - row max)` (`shifted_logits`: exact for any `scale`), plus the
    biases; masked logits are the dtype's lowest finite value (`fill_masked`), so a partly masked
    row's masked weights are exactly 0 at any logit scale. A fully masked row softmaxes to uniform weights: its output is zeroed after the value
    product (a boolean reduction of the mask and a pass over `(batch, query_len, heads, depth)`
    instead of a float pass over the weights), and the weights are zeroed only when they are
    returned. A causal mask alone never empties a row (query `i` always sees key 0), so it needs
    neither.

    One query (a cached decoding step) outside XLA takes `keras_attn.kernels.single_query`'s two
    products, without transposing the keys and values, and its element-wise softmax: the same values.

    With `hard=True` the weights are `hard_weights(logits, soft)`: one-hot on the argmax of
    the allowed keys in the forward pass, the gradient of the softmax at the same scale in the
    backward pass (straight-through).

    With a `logit_soft_cap` the logits are `soft_capped(scale * Q K^T)`, bounded by the cap (no
    shift needed), before the biases and the mask.

    Dropout applies to the weights cast to the value's dtype (the product's), so under mixed
    precision its noise, mask and dropped weights are float16 like Keras's, not float32.

    A `position_bias` is computed from the positions of all the queries (from `query_offset`)
    and keys, `(1, heads, query_len, key_len)`, the size of the logits this kernel holds anyway.

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype of `value`, and, when
        `return_weights`, the weights `(batch, heads, query_len, key_len)` in the same dtype.
    """
    check_scale(scale)  # called directly too: a scale past float32 would make every logit inf
    scale = resolved_scale(scale, query.shape[-1])
    rows_may_be_empty = may_empty_rows(mask, pattern)
    mask = pattern_mask(mask, pattern, ops.shape(query)[1], ops.shape(key)[1], query_offset)
    one_query = single_query.applies(query, key)  # a cached decoding step outside XLA: no transposes
    if logit_soft_cap is None:
        scaled_query, logits_scale = query_with_scale(query, scale)
        logits = single_query.logits(scaled_query, key) if one_query else attention_logits(scaled_query, key)
        logits = shifted_logits(logits, logits_scale, mask)  # (batch, heads, query_len, key_len)
    else:  # capped in (-cap, cap) whatever `scale * Q K^T` is: an overflow to inf caps to the cap
        logits = single_query.logits(query, key) if one_query else attention_logits(query, key)
        logits = soft_capped(
            ops.multiply(logits, ops.convert_to_tensor(scale, logits.dtype)), logit_soft_cap
        )  # exact for float64
    if bias is not None:
        logits = logits + ops.cast(bias, logits.dtype)
    logits = _add_position_bias(logits, check_position_bias(position_bias, query.shape[2]), query_offset)
    if mask is not None:
        logits = fill_masked(logits, mask)
    row_softmax = single_query.softmax if one_query else softmax
    weights = softmax_with_exact_saturated_gradient(logits, row_softmax)  # (batch, heads, query_len, key_len), float32
    if hard:
        weights = hard_weights(logits, weights)
    dropped = ops.cast(weights, value.dtype)  # (batch, heads, query_len, key_len)
    if dropout_rate > 0.0:  # in the value's dtype, as Keras's layer: float16 holds half the bytes
        dropped = keras.random.dropout(dropped, dropout_rate, seed=seed_generator)
    if one_query:
        output = single_query.values(dropped, value)
    else:
        output = weighted_values(dropped, value)  # (batch, query_len, heads, value_depth)
    if rows_may_be_empty:
        output = _zero_rows_without_keys(output, mask)
    if return_weights:
        weights = zero_masked(weights, mask) if rows_may_be_empty else weights
        return output, ops.cast(weights, value.dtype)
    return output


def _add_position_bias(logits, position_bias, query_offset):
    """`logits (batch, heads, query_len, key_len)` plus the position bias of queries at `query_offset + i`."""
    if position_bias is None:
        return logits
    query_len, key_len = ops.shape(logits)[2], ops.shape(logits)[3]
    query_positions = ops.arange(query_len, dtype="int32") + ops.cast(query_offset, "int32")
    key_positions = ops.arange(key_len, dtype="int32")
    bias = position_bias.block_bias(position_bias.bias_parameters(), query_positions, key_positions)  # (1, h, q, k)
    return logits + ops.cast(bias, logits.dtype)


def hard_weights(logits, soft):
    """One-hot weights on each row's argmax, with the straight-through gradient of `soft`.

    Forward: `1` at the first (lowest) key index where the masked logits `(batch, heads,
    query_len, key_len)` reach their row maximum, `0` elsewhere. Masked logits hold the dtype's
    lowest finite value (`fill_masked`), below every allowed logit, so the argmax is an allowed key whenever the row has one; a row without allowed keys is zeroed
    by the caller, as for soft weights. Backward: `hard + (soft - stop_gradient(soft))` is exactly
    `hard` in value and has the gradient of `soft`, so the logits receive the softmax gradient at
    this temperature, `soft * (dW - rowsum(soft * dW))` with `dW = dO V^T`, and the value receives
    `hard^T dO` (the selected keys only).
    """
    key_len = ops.shape(logits)[-1]
    positions = ops.arange(key_len, dtype="int32")  # (key_len,)
    row_max = ops.max(logits, axis=-1, keepdims=True, initial=mask_fill(logits.dtype))  # `initial`: empty inputs
    at_max = ops.equal(logits, row_max)  # (batch, heads, query_len, key_len)
    first = ops.min(ops.where(at_max, positions, key_len), axis=-1, keepdims=True, initial=key_len)  # (b, h, q, 1)
    hard = ops.cast(ops.equal(positions, first), soft.dtype)  # (batch, heads, query_len, key_len)
    return hard + (soft - ops.stop_gradient(soft))


def _zero_rows_without_keys(output, mask):
    """Zeros the output `(batch, query_len, heads, depth)` of query rows whose keys are all masked."""
    has_keys = ops.any(mask, axis=-1)  # (batch | 1, heads | 1, query_len | 1)
    has_keys = ops.expand_dims(ops.transpose(has_keys, (0, 2, 1)), -1)  # (batch | 1, query_len | 1, heads | 1, 1)
    return zero_masked(output, has_keys)
