"""The adapter of KerasHub's SAM mask-decoder attention, `MultiHeadAttentionWithDownsampling`: its `call(query, value, key)`.

The layer has no hook: its `call` projects the query, key and value to `num_heads` heads of
`key_dim // downsample_rate` channels, attends with the scale `1 / sqrt(channels per head)`, no
mask, and projects the heads back (`out_proj`). On the core op: the same projections and scale.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention

HOOK = "call"


def compute_attention(layer, query, value, key):
    """The layer's `call`, its attention on `scaled_dot_product_attention`."""
    batch, length = ops.shape(query)[0], ops.shape(query)[1]

    def heads(states):  # (batch, length, channels) -> (batch, length, heads, channels / heads)
        return ops.reshape(states, (batch, -1, layer.num_heads, layer.internal_dims))

    output = hub_attention(
        heads(layer.query_proj(query)),
        heads(layer.key_proj(key)),
        heads(layer.value_proj(value)),
        scale=1.0 / ops.sqrt(ops.cast(layer.internal_dims, "float32")),
        implementation=layer.implementation,
    )
    return layer.out_proj(ops.reshape(output, (batch, length, layer.num_heads * layer.internal_dims)))


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
