"""One validated attention call, as the dispatcher hands it to a kernel.

`keras_attn.dispatch.attention.scaled_dot_product_attention` validates its arguments, resolves the
shorthands into one pattern, the scale and the effective dropout rate, and then asks each kernel
module of `keras_attn.kernels.KERNELS` two questions about this record: `why_unsupported(call)` (a
message, or `None` when the kernel can take the call) and `attend(call)` (the result). A new kernel
plugs in by answering both; a new input is one new field here that the kernels which cannot take it refuse.
"""

import dataclasses

from keras import ops

from keras_attn.core.softmax import grouped_heads


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """The inputs of one attention call (see `scaled_dot_product_attention` for their meaning).

    `key` and `value` have `kv_heads` heads, a divisor of the query's (grouped-query attention):
    the dense kernel takes them so, the others repeat them to the query's (`with_repeated_heads`);
    `scale` is a number or a tensor (the
    dispatcher resolves `None`); `dropout_rate` is the effective rate (0 outside training); `pattern` merges `pattern=`
    with the `is_causal` / `sliding_window` shorthands (`None`: every key allowed); `training` says
    whether gradients are expected (what `keras_attn.kernels.cost` features count).
    """

    query: object  # (batch, query_len, heads, depth)
    key: object  # (batch, key_len, kv_heads, depth)
    value: object  # (batch, key_len, kv_heads, value_depth)
    mask: object = None  # bool, broadcastable to (batch, heads, query_len, key_len)
    bias: object = None  # float, broadcastable to (batch, heads, query_len, key_len)
    pattern: object = None
    query_offset: object = 0
    scale: object = None  # None: keras_attn.core.softmax.default_scale, 1 / sqrt(depth)
    dropout_rate: float = 0.0
    seed_generator: object = None
    return_weights: bool = False
    hard: bool = False
    position_bias: object = None  # a keras_attn.core.position_bias.PositionBias for the query heads
    query_segment_ids: object = None  # int32 (batch, query_len), 0 for padding: keras_attn.core.segments
    key_segment_ids: object = None  # int32 (batch, key_len); both or neither
    logit_soft_cap: object = None  # a positive float: logits `tanh(scale * Q K^T / cap) * cap` before bias and mask
    training: bool = False  # a training call: the cost model predicts its forward and backward passes


def with_repeated_heads(call):
    """`call` with its key and value heads repeated to the query's, `(batch, seq, kv_heads, depth)` ->
    `(batch, seq, heads, depth)`: how every kernel but dense takes grouped heads."""
    groups = grouped_heads(call.query, call.key)
    if groups == 1:
        return call
    return dataclasses.replace(
        call, key=ops.repeat(call.key, groups, axis=2), value=ops.repeat(call.value, groups, axis=2)
    )


def why_not_tensorflow_streaming(call):
    """Why a TensorFlow kernel that never holds the whole weights (chunked, blockwise) cannot take
    the call, or `None`: the weights are to be returned, or the attention is hard (its argmax
    across key blocks is not written there: dense takes it)."""
    if call.return_weights:
        return "`return_weights=False`: it never materialises the whole attention matrix. Received: return_weights=True"
    if call.hard:
        return "`hard=False`: hard (argmax) attention runs on the dense kernel only. Received: hard=True"
    return None
