"""The adapter of KerasHub's VideoPrism attention, `VideoPrismAttention`: its `call(query, value, key, attention_mask, training)`.

The layer has no hook: its `call` projects the query, key and value to `num_heads` heads of
`key_dim`, scales the queries (its learned `per_dim_scale_layer`, or `1 / sqrt(key_dim)`),
soft-caps the logits (`attention_logit_soft_cap`), subtracts `1e9` where the mask (of rank 2 or
3) is off, drops out the weights (`dropout_layer`) and projects the heads (`output_dense`). On
the core op: the queries scaled by the layer (its scale may be learned per channel), `scale=1`,
`logit_soft_cap`, the mask and the dropout.
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout

HOOK = "call"


def compute_attention(layer, query, value, key=None, attention_mask=None, training=None):
    """The layer's `call`, its attention on `scaled_dot_product_attention`."""
    key = query if key is None else key
    scaled_query = layer.query_dense(query)
    if layer.use_per_dim_scale:
        scaled_query = layer.per_dim_scale_layer(scaled_query)
    else:
        scaled_query = scaled_query * ops.rsqrt(ops.cast(layer.key_dim, layer.compute_dtype))
    output = hub_attention(
        scaled_query,
        layer.key_dense(key),
        layer.value_dense(value),
        mask=None if attention_mask is None else _rank_4(ops.cast(attention_mask, "bool")),
        scale=1.0,
        logit_soft_cap=layer.attention_logit_soft_cap,
        **weights_dropout(layer.dropout_layer, training),
        implementation=layer.implementation,
    )
    return layer.output_dense(output)


def _rank_4(mask):
    """`(batch, 1, query_len | 1, key_len)` of a `(batch, query_len, key_len)` or `(batch, key_len)` mask."""
    return mask[:, None] if len(mask.shape) == 3 else mask[:, None, None]


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
