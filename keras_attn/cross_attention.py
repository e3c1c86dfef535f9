"""Cross-attention: queries from one sequence, keys and values from another."""

import keras

from keras_attn.multi_head_attention import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention from a query sequence to a context sequence.

    `CrossAttention(...)(query, context)` is `MultiHeadAttention(...)(query, context)`. The
    context may have another length and another feature width than the query; the output has
    the query's width (or `output_shape`). The constructor arguments and weights are those of
    `MultiHeadAttention`.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head for query and key.
        **kwargs: every other constructor argument of `keras_attn.MultiHeadAttention`.

    Call arguments:
        query: `(batch, query_len, query_features)`, e.g. decoder states.
        context: `(batch, context_len, context_features)`, e.g. encoder outputs.
        query_mask: optional boolean `(batch, query_len)`; the Keras mask of `query` otherwise.
        context_mask: optional boolean `(batch, context_len)`; the Keras mask of `context`
            otherwise. Padded context positions never influence the output.
        attention_mask: optional boolean mask broadcastable to
            `(batch, query_len, context_len)` or `(batch, heads, query_len, context_len)`.
        attention_bias: optional additive bias broadcastable to
            `(batch, heads, query_len, context_len)`.
        return_attention_scores: if `True`, also return the weights.
        training: whether attention dropout is active.
        cache: optional `(batch, 2, context_len, kv_heads, key_dim)` keys/values of the context
            projected once (see `MultiHeadAttention`); `context` is then ignored and the call
            returns `(output, cache)`.

    Example:

    >>> decoder_states = keras.random.normal((2, 7, 32))
    >>> encoder_outputs = keras.random.normal((2, 11, 48))
    >>> tuple(CrossAttention(num_heads=4, key_dim=8)(decoder_states, encoder_outputs).shape)
    (2, 7, 32)
    """

    def build(self, query_shape, context_shape):
        super().build(query_shape, context_shape)

    def call(
        self,
        query,
        context,
        query_mask=None,
        context_mask=None,
        attention_mask=None,
        attention_bias=None,
        return_attention_scores=False,
        training=None,
        cache=None,
    ):
        return super().call(
            query,
            context,
            query_mask=query_mask,
            value_mask=context_mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
        )

    def compute_output_shape(self, query_shape, context_shape):
        return super().compute_output_shape(query_shape, context_shape)

    def compute_output_spec(self, query, context, return_attention_scores=False, cache=None, **unused_masks_and_flags):
        return super().compute_output_spec(
            query, context, return_attention_scores=return_attention_scores, cache=cache
        )
