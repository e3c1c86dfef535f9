"""The adapter of KerasHub's PaliGemma ViT attention, `PaliGemmaVitAttention`: its `call(x, attention_mask, return_attention_scores, training)`.

The layer has no hook: its `call` projects the tokens to `num_heads` heads of `head_dim`, adds the
additive `attention_mask` to the logits scaled by `1 / sqrt(head_dim)`, drops out the weights
(`dropout_layer`) and returns the output projection with the weights (before dropout), which its
encoder block ignores. On the core op: `scale`, the mask as the additive `bias`, the dropout, and
the weights returned, so the dense kernel (`"auto"` picks it; a streaming kernel raises).
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout

HOOK = "call"


def compute_attention(layer, x, attention_mask=None, return_attention_scores=None, training=False):
    """`(output, weights)`: the layer's `call`, its attention on `scaled_dot_product_attention`."""
    del return_attention_scores  # KerasHub's call returns the weights either way
    batch = ops.shape(x)[0]

    def heads(states):  # (batch, length, hidden_dim) -> (batch, length, heads, head_dim)
        return ops.reshape(states, (batch, -1, layer.num_heads, layer.head_dim))

    output, weights = hub_attention(
        heads(layer.query_proj(inputs=x)),
        heads(layer.key_proj(inputs=x)),
        heads(layer.value_proj(inputs=x)),
        bias=attention_mask,
        scale=1.0 / ops.sqrt(ops.cast(layer.head_dim, "float32")),
        **weights_dropout(layer.dropout_layer, training),
        return_weights=True,
        implementation=layer.implementation,
    )
    output = layer.out_proj(ops.reshape(output, (batch, -1, layer.hidden_dim)), training=training)
    return output, weights


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
