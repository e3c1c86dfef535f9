"""Cross-attention: queries from one sequence, keys and values from another."""

import keras

from keras_attn.layers.multi_head_attention import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention from a query sequence to a context sequence.

    `CrossAttention(...)(query, value)` is `MultiHeadAttention(...)(query, value)`. The
    context (`value`) may have another length and another feature width than the query; the output has
    the query's width (or `output_shape`). The constructor arguments and weights are those of
    `MultiHeadAttention`.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head for query and key.
        **kwargs: every other constructor argument of `keras_attn.MultiHeadAttention`.

    Call arguments: those of `keras_attn.MultiHeadAttention`: `layer(query, value, key=None,
    query_mask=..., value_mask=..., ...)`, `value` the context (e.g. encoder outputs) and
    `value_mask` its padding, the Keras mask of `value` when not given. With a `cache`
    `(batch, 2, context_len, kv_heads, key_dim)` of the context projected once, `value` is ignored
    and the call returns `(output, cache)`. Packed rows: `query_segment_ids` `(batch, query_len)`
    and `key_segment_ids` `(batch, context_len)` (`0` for padding): a query of document `d` attends
    only to the context tokens of document `d`.

    Example:

    >>> decoder_states = keras.random.normal((2, 7, 32))
    >>> encoder_outputs = keras.random.normal((2, 11, 48))
    >>> tuple(CrossAttention(num_heads=4, key_dim=8)(decoder_states, encoder_outputs).shape)
    (2, 7, 32)
    """
