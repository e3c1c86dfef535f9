"""Self-attention: every position of one sequence attends to the positions of the same sequence."""

import keras

from keras_attn.multi_head_attention import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention over one sequence, with one fused QKV projection.

    `SelfAttention(...)(x)` is `MultiHeadAttention(...)(x, x)`: it takes the same constructor
    arguments (`num_heads`, `key_dim`, `dropout`, `sliding_window`, `num_key_value_heads`, ...)
    and has the same weights.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head for query and key.
        **kwargs: every other constructor argument of `keras_attn.MultiHeadAttention`.

    Call arguments:
        inputs: `(batch, seq, features)`.
        mask: optional boolean padding mask `(batch, seq)`; taken from the Keras mask of
            `inputs` when not given. Padded positions are never attended to, and their own
            rows attend to nothing (zero attention output).
        attention_mask: optional boolean mask broadcastable to `(batch, seq, seq)` or
            `(batch, heads, seq, seq)`.
        attention_bias: optional additive bias broadcastable to `(batch, heads, seq, seq)`.
        return_attention_scores: if `True`, also return the weights `(batch, heads, seq, seq)`.
        training: whether attention dropout is active.

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> tuple(SelfAttention(num_heads=4, key_dim=8)(x).shape)
    (2, 10, 32)
    """

    causal = False

    def build(self, inputs_shape):
        super().build(inputs_shape, inputs_shape)

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        attention_bias=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
    ):
        return super().call(
            inputs,
            inputs,
            query_mask=mask,
            value_mask=mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            training=training,
            use_causal_mask=self.causal,
            cache=cache,
            cache_update_index=cache_update_index,
        )

    def compute_output_shape(self, inputs_shape):
        return super().compute_output_shape(inputs_shape, inputs_shape)

    def compute_output_spec(self, inputs, return_attention_scores=False, cache=None, **unused_masks_and_flags):
        return super().compute_output_spec(
            inputs, inputs, return_attention_scores=return_attention_scores, cache=cache
        )

    def compute_mask(self, inputs, mask=None):
        # With a cache, `mask` covers the whole cache, not these positions: it is not the output's.
        if mask is not None and None not in (mask.shape[1], inputs.shape[1]) and mask.shape[1] != inputs.shape[1]:
            return None
        return mask
