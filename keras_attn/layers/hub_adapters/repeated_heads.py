"""The adapter of KerasHub's Llama and Mistral attention: `_compute_attention(query, key, value, attention_mask)`.

Their `call` applies the rotary embedding, writes the cache and repeats the key/value heads to the
query heads (grouped-query attention) before the hook; the hook scales by `_inv_norm_factor` and
takes a `(batch, query_len, key_len)` mask holding the causal mask, the padding and, for Mistral,
the sliding window (the decoder block builds it). The core op takes the repeated heads as they
come: it would repeat grouped heads itself, so undoing KerasHub's repeat saves nothing. Dropout is
applied by the layer's `call`, after the hook.
"""

from keras import ops

from keras_attn.core.attention import scaled_dot_product_attention


def compute_attention(layer, query, key, value, attention_mask=None):
    """`(batch, query_len, heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    mask = None if attention_mask is None else ops.cast(attention_mask[:, None], "bool")
    return scaled_dot_product_attention(
        query, key, value, mask=mask, scale=layer._inv_norm_factor, implementation=layer.implementation
    )


def why_unsupported(layer):
    """Every layer of these classes is supported: `None`."""
    return None
