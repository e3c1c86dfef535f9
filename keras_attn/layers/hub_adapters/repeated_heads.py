"""The adapter of KerasHub's `_compute_attention(query, key, value, attention_mask=None, ...)` hooks.

The decoder attention of Llama, Mistral, Mixtral, Phi3, Qwen, Qwen MoE, Qwen3, Qwen3 MoE, Qwen3.5,
SmolLM3 and GPT-NeoX share this hook: their `call` projects the inputs, applies the rotary
embedding, writes the cache and (most of them) repeats the key/value heads to the query heads
before it; the hook scales by `_inv_norm_factor` and takes a `(batch, query_len, key_len)` mask
holding the causal mask, the padding and, for Mistral, the sliding window (the decoder block
builds it; a mask its block built within the causal pattern passes that pattern too,
`causal_masks`). Its fused branch calls `ops.dot_product_attention`, which they take only where
KerasHub's `_use_fused_attention_op()` holds, never on TensorFlow; this adapter runs that branch on
`keras_attn.scaled_dot_product_attention`. The core op takes the heads as they come (it groups
the query heads itself when the key/value heads are fewer).

What the classes add, each read from the layer as KerasHub's own hook reads it:

- a sliding window applied in the hook, to queries sitting at `cache_update_index` (the band
  `|i - j| < sliding_window_size`): Qwen and Qwen MoE when `use_sliding_window_attention`, Qwen3,
  Qwen3 MoE and Qwen3.5 when `sliding_window_size` is set; the core op's `sliding_window` and
  `query_offset`;
- dropout of the attention weights in the hook (GPT-NeoX, `training`): the core op's, with the
  seed generator of the layer's `_attn_dropout_layer`. The other classes drop out after the hook.
"""

from keras import ops

from keras_attn.layers.hub_adapters.causal_masks import within_causal_pattern
from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout


def compute_attention(layer, query, key, value, attention_mask=None, cache_update_index=None, training=None):
    """`(batch, query_len, heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    mask = None if attention_mask is None else ops.cast(attention_mask[:, None], "bool")
    window = _sliding_window(layer) if attention_mask is not None else None
    return hub_attention(
        query,
        key,
        value,
        mask=mask,
        is_causal=within_causal_pattern(attention_mask),
        sliding_window=window,
        query_offset=0 if window is None or cache_update_index is None else cache_update_index,
        scale=layer._inv_norm_factor,
        **weights_dropout(getattr(layer, "_attn_dropout_layer", None), training),
        implementation=layer.implementation,
    )


def _sliding_window(layer):
    """The window the class's hook applies (`None` if it applies none), read as KerasHub's hook reads it."""
    if hasattr(layer, "use_sliding_window_attention"):
        return layer.sliding_window_size if layer.use_sliding_window_attention else None
    return getattr(layer, "sliding_window_size", None) or None


def why_unsupported(layer):
    """Every layer of these classes is supported: `None`."""
    return None
