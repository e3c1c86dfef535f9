"""The adapter of KerasHub's Gemma attention: `_compute_attention(q, k, v, attention_mask, training, cache_update_index)`.

The hook takes the key/value heads as they are (grouped-query attention: the core op groups the
query heads), scales by `1 / sqrt(head_dim)` (or `1 / sqrt(hidden_dim / num_query_heads)` without
`query_head_dim_normalize`), and applies the layer's sliding window, when it has one and a mask
is given, to queries sitting at `cache_update_index`: the core op's `sliding_window` and
`query_offset`, the same band `|i - j| < sliding_window_size`. Attention dropout is the core op's,
with the seed generator of the layer's dropout layer. Gemma 2's logit soft-capping
(`attention_logit_soft_cap`, `tanh(logits / cap) * cap` on the scaled logits, before the mask) is
the core op's `logit_soft_cap`, which applies it at the same place. A mask that Gemma's decoder
block built within the causal pattern passes that pattern too (`causal_masks`).
"""

import math

from keras import ops

from keras_attn.layers.hub_adapters.causal_masks import within_causal_pattern
from keras_attn.layers.hub_adapters.hub_attention import hub_attention


def compute_attention(layer, q, k, v, attention_mask, training=False, cache_update_index=0):
    """`(batch, query_len, num_query_heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    head_dim = layer.head_dim if layer.query_head_dim_normalize else layer.hidden_dim // layer.num_query_heads
    mask = None if attention_mask is None else ops.cast(attention_mask[:, None], "bool")
    windowed = layer.use_sliding_window_attention and attention_mask is not None
    return hub_attention(
        q,
        k,
        v,
        mask=mask,
        is_causal=within_causal_pattern(attention_mask),
        sliding_window=layer.sliding_window_size if windowed else None,
        query_offset=cache_update_index if windowed else 0,
        scale=1.0 / math.sqrt(head_dim),
        dropout_rate=layer.dropout,
        training=training,
        seed_generator=layer.dropout_layer.seed_generator if layer.dropout else None,
        implementation=layer.implementation,
        logit_soft_cap=layer.logit_soft_cap,
    )


def why_unsupported(layer):
    """Always `None`: every Gemma attention layer runs on the core op (soft-capping included)."""
    del layer
    return None
