"""The adapter of KerasHub's Gemma 4 text attention: `_compute_attention(q, k, v, attention_mask, training, cache_update_index)`.

Gemma 4's hook has Gemma's arguments but not its computation: the query and key norms replace
the `1 / sqrt(head_dim)` scale (the scale is 1), the sliding window is already in the mask its
decoder block builds (so `cache_update_index` is not needed), and the key/value heads are the
layer's `effective_num_kv_heads` (the core op groups the query heads over them). The logit
soft-cap (`logit_soft_cap`) and the dropout of the weights are the core op's.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout


def compute_attention(layer, q, k, v, attention_mask, training=False, cache_update_index=0):
    """`(batch, query_len, num_query_heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    del cache_update_index  # the window is in the mask
    return hub_attention(
        q,
        k,
        v,
        mask=None if attention_mask is None else ops.cast(attention_mask[:, None], "bool"),
        scale=1.0,
        logit_soft_cap=layer.logit_soft_cap,
        **weights_dropout(layer.dropout_layer, training),
        implementation=layer.implementation,
    )


def why_unsupported(layer):
    """Every Gemma 4 text attention layer is supported: `None`."""
    del layer
    return None
