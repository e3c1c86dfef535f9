"""The adapter of KerasHub's Gemma 3 attention: Gemma's hook (`keras_attn.layers.hub_adapters.gemma`).

`CachedGemma3Attention._compute_attention` takes the same arguments and attributes as Gemma's
(grouped key/value heads, the scale, the causal sliding window at `cache_update_index`, dropout,
the logit soft-cap) and computes the same attention, so Gemma's adapter computes it. What Gemma 3
adds: `use_bidirectional_attention` (the embedding models) windows by a band centred on each
query, `[i - (w - 1 - w // 2), i + w // 2]`, which the core op's symmetric `sliding_window` is not.
"""

from keras_attn.layers.hub_adapters import gemma

compute_attention = gemma.compute_attention  # the same hook, computed by Gemma's adapter


def why_unsupported(layer):
    """`None`, or why this layer's attention cannot run on the core op."""
    if layer.use_bidirectional_attention and layer.use_sliding_window_attention:
        return (
            "Gemma 3's bidirectional sliding window (use_bidirectional_attention=True) is a band of "
            f"{layer.sliding_window_size} keys centred on each query, not the symmetric band of "
            "keras_attn.scaled_dot_product_attention's `sliding_window`"
        )
    return gemma.why_unsupported(layer)
