"""The adapter of KerasHub's T5Gemma and T5Gemma 2 attention: `_compute_attention(q, k, v, attention_mask, training)`.

Their encoder and decoder blocks build the mask as an additive bias (`0` where a query may attend,
`-1e9` where not) of `(batch, 1, query_len, key_len)`, and `call` repeats the key/value heads to the
query heads before the hook. The hook scales the logits by `scaling` (`query_pre_attn_scalar ** -0.5`),
soft-caps them (`logit_soft_cap`, `tanh(logits / cap) * cap`) and then adds the mask, drops out
the weights with `dropout_layer` when `training`: on the core op, `scale`, `logit_soft_cap` (applied
at the same place) and the mask as the additive `bias`; a query whose keys the mask all hides
gets KerasHub's row, not the core op's zero (`keras_attn.layers.hub_adapters.additive_rows`).
"""

from keras_attn.layers.hub_adapters.additive_rows import with_additive_rows
from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout


def compute_attention(layer, query_states, key_states, value_states, attention_mask, training=False):
    """`(batch, query_len, heads, head_dim)`: KerasHub's hook, on `scaled_dot_product_attention`."""
    output = hub_attention(
        query_states,
        key_states,
        value_states,
        bias=attention_mask,
        scale=layer.scaling,
        logit_soft_cap=layer.logit_soft_cap,
        **weights_dropout(layer.dropout_layer, training),
        implementation=layer.implementation,
    )
    if attention_mask is None:
        return output
    return with_additive_rows(
        output, query_states, key_states, value_states, attention_mask, layer.scaling, layer.logit_soft_cap
    )


def why_unsupported(layer):
    """Every layer of these classes is supported: `None`."""
    del layer
    return None
