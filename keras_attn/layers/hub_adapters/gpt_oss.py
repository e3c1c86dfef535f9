"""The adapter of KerasHub's GPT-OSS attention: `_compute_attention(query, key, value, attention_mask, start_index)`.

GPT-OSS's attention sinks are one learned logit per head that joins every row's softmax and
carries no value: `softmax([logits, sink])` weighs the keys, and the sink's weight is dropped. On
the core op that is one more key, with a zero key and a zero value, whose logit is the sink: the
additive `bias` `(1, heads, 1, key_len + 1)` (0 on the real keys), the mask extended to let every
query reach it. The hook scales by `_inv_norm_factor` and, with `sliding_window`, lets query `i`
(at `start_index + i`) reach the keys `j >= start_index + i - sliding_window`; that window is
written into the mask, since the sink key has no position the core op's `sliding_window` could
use.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention


def compute_attention(layer, query, key, value, attention_mask=None, start_index=0):
    """`(batch, query_len, heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    batch, query_len = ops.shape(query)[0], ops.shape(query)[1]
    key_len = ops.shape(key)[1]
    allowed = ops.ones((batch, query_len, key_len), "bool") if attention_mask is None else attention_mask
    allowed = ops.cast(allowed, "bool")
    if layer.sliding_window is not None and layer.sliding_window > 0:
        query_positions = ops.arange(query_len) + start_index
        in_window = ops.arange(key_len)[None, :] >= query_positions[:, None] - layer.sliding_window
        allowed = ops.logical_and(allowed, in_window[None])
    sink_column = ops.ones((batch, query_len, 1), "bool")
    sink_key = ops.zeros_like(key[:, :1])
    sinks = ops.reshape(ops.cast(layer.sinks, "float32"), (1, -1, 1, 1))
    bias = ops.concatenate([ops.zeros((1, layer.num_query_heads, 1, key_len), "float32"), sinks], axis=-1)
    return hub_attention(
        query,
        ops.concatenate([key, sink_key], axis=1),
        ops.concatenate([value, ops.zeros_like(value[:, :1])], axis=1),
        mask=ops.concatenate([allowed, sink_column], axis=-1)[:, None],
        bias=bias,
        scale=layer._inv_norm_factor,
        implementation=layer.implementation,
    )


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
