"""The adapter of KerasHub's DeBERTaV3 attention: `_compute_attention(query, key, value, rel_embeddings, attention_mask, training)`.

DeBERTa's disentangled attention adds to the content logits `Q K^T * scale_factor` the
content-to-position and position-to-content logits of the relative position embeddings; the
layer computes those (`_compute_disentangled_attention`, after its position dropout) as a
`(batch, heads, query_len, key_len)` tensor, which is the core op's additive `bias` here, with
`scale = scale_factor`, the `(batch, query_len, key_len)` mask and the dropout of the weights
(`_attn_dropout_layer`). The hook returns the attention weights beside the output (the layer's
`return_attention_scores`), so the core op returns them too: the dense kernel, whose
`(query_len, key_len)` weights are no larger than the bias the layer has built already (`"auto"`
picks it; a streaming kernel, which never holds the weights, raises).
"""

from keras import ops

from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout


def compute_attention(layer, query, key, value, rel_embeddings, attention_mask=None, training=None):
    """`(output, weights)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    rel_embeddings = layer._position_dropout_layer(rel_embeddings, training=training)
    return hub_attention(
        query,
        key,
        value,
        mask=None if attention_mask is None else ops.cast(attention_mask[:, None], "bool"),
        bias=layer._compute_disentangled_attention(query=query, key=key, rel_embeddings=rel_embeddings),
        scale=layer.scale_factor,
        **weights_dropout(layer._attn_dropout_layer, training),
        return_weights=True,
        implementation=layer.implementation,
    )


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
