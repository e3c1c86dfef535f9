"""The adapter of KerasHub's T5 attention: its `call(hidden_states, mask, key_value_states, position_bias, cache, cache_update_index, training)`.

T5's attention has no hook: its `call` projects the queries (and the keys and values of the
inputs, or of the encoder states `key_value_states` for cross-attention), writes the cache, and
adds a position bias to the unscaled logits, which it returns for the next layers to reuse: the
first layer of a stack computes it (its learned relative position buckets, `compute_bias`, from the
queries at `cache_update_index`, or zeros without them) and adds the mask as `-1e9`. On the core op
that bias is the additive `bias` and the scale is 1; the dropout of the weights is the core op's.
A query whose keys the mask all hides gets T5's own row, not the core op's zero
(`keras_attn.layers.hub_adapters.additive_rows`).
"""

from keras import ops

from keras_attn.layers.hub_adapters.additive_rows import with_additive_rows
from keras_attn.layers.hub_adapters.cached_projections import cached_keys_and_values
from keras_attn.layers.hub_adapters.hub_attention import hub_attention
from keras_attn.layers.hub_adapters.weights_dropout import weights_dropout

HOOK = "call"


def compute_attention(
    layer,
    hidden_states,
    mask=None,
    key_value_states=None,
    position_bias=None,
    cache=None,
    cache_update_index=None,
    training=False,
):
    """`(output, position_bias, cache)`: T5's attention `call`, its attention on `scaled_dot_product_attention`."""
    batch, length = ops.shape(hidden_states)[0], ops.shape(hidden_states)[1]

    def heads(states):  # (batch, length, heads * head_dim) -> (batch, length, heads, head_dim)
        return ops.reshape(states, (batch, -1, layer.num_heads, layer.key_value_dim))

    key_value_inputs = hidden_states if key_value_states is None else key_value_states
    key, value, cache = cached_keys_and_values(
        heads(layer.key_projector(key_value_inputs)),
        heads(layer.value_projector(key_value_inputs)),
        cache,
        cache_update_index,
    )
    if position_bias is None:
        position_bias = _position_bias(layer, length, ops.shape(key)[1], mask, cache_update_index)
    query = heads(layer.query_projector(hidden_states))
    output = hub_attention(
        query,
        key,
        value,
        bias=position_bias,
        scale=1.0,
        **weights_dropout(layer.dropout_layer, training),
        implementation=layer.implementation,
    )
    output = with_additive_rows(output, query, key, value, position_bias, scale=1.0)
    output = layer.output_projector(ops.reshape(output, (batch, -1, layer.inner_dim)))
    return output, position_bias, cache


def _position_bias(layer, query_len, key_len, mask, cache_update_index):
    """The bias the first layer of a stack computes: its relative position buckets (or zeros), the mask as `-1e9`."""
    if layer.use_relative_attention_bias:
        start = 0 if cache_update_index is None else cache_update_index
        bias = layer.compute_bias(query_len, key_len, query_start_index=start)
    else:
        bias = ops.zeros((1, layer.num_heads, query_len, key_len), layer.compute_dtype)
    if mask is None:
        return bias
    return bias + (1.0 - ops.cast(mask[:, None], bias.dtype)) * -1e9


def why_unsupported(layer):
    """Every layer of this class is supported: `None`."""
    del layer
    return None
