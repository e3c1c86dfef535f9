"""The adapter of KerasHub's ViTDet (and SAM image encoder) attention, `MultiHeadAttentionWithRelativePE`: its `call(x)`.

The layer has no hook: its `call` takes a `(batch, height, width, channels)` grid (a whole image
or one window), projects it with one `qkv` layer to `num_heads` heads of `key_dim`, scales the
queries by `scale` and, with `use_rel_pos`, adds the decomposed relative positions
(`add_decomposed_relative_pe`: a height and a width term computed from the queries and the
layer's tables) to the logits. On the core op that term is the additive `bias` (the layer's own
method, given zero logits, so its tables and their gradients), with `scale`.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention

HOOK = "call"


def compute_attention(layer, x):
    """The layer's `call`, its attention on `scaled_dot_product_attention`."""
    batch, height, width, channels = ops.shape(x)
    length, heads = height * width, layer.num_heads
    qkv = ops.reshape(layer.qkv(x), (batch, length, 3, heads, layer.key_dim))
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (batch, length, heads, key_dim)
    bias = None
    if layer.use_rel_pos:
        # The layer's term takes its queries as (batch * heads, length, key_dim), unscaled.
        queries = ops.reshape(ops.transpose(query, (0, 2, 1, 3)), (batch * heads, length, layer.key_dim))
        relative = layer.add_decomposed_relative_pe(
            ops.zeros((batch * heads, length, length), queries.dtype),
            queries=queries,
            query_size=(height, width),
            key_size=(height, width),
        )
        bias = ops.reshape(relative, (batch, heads, length, length))
    output = hub_attention(query, key, value, bias=bias, scale=layer.scale, implementation=layer.implementation)
    return layer.projection(ops.reshape(output, (batch, height, width, channels)))


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
