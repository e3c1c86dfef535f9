"""Self-attention: every position of one sequence attends to the positions of the same sequence."""

import dataclasses

import keras

from keras_attn.layers.multi_head_attention import MultiHeadAttention


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

    Call arguments: those of `keras_attn.MultiHeadAttention` with `value=None` (self-attention):
        `layer(x, query_mask=..., value_mask=..., attention_mask=..., use_causal_mask=...,
        return_attention_scores=..., training=...)`; the masks are the Keras mask of `x` when not
        given. A `value` or `key` other than `x` raises a `ValueError` (`capabilities.cross` is
        `False`: use `MultiHeadAttention` or `CrossAttention`). Packed rows: `segment_ids`
        `(batch, seq)` (`0` for padding) keeps each token's attention inside its document; a
        cached step takes `query_segment_ids` and `key_segment_ids` instead (see
        `keras_attn.MultiHeadAttention`).

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> tuple(SelfAttention(num_heads=4, key_dim=8)(x).shape)
    (2, 10, 32)
    """

    capabilities = dataclasses.replace(
        MultiHeadAttention.capabilities,
        cross=False,
        reasons=(("cross", "It attends over one sequence: use MultiHeadAttention or CrossAttention."),),
    )

    def compute_mask(self, inputs, mask=None):
        # With a cache, `mask` covers the whole cache, not these positions: it is not the output's.
        if mask is not None and None not in (mask.shape[1], inputs.shape[1]) and mask.shape[1] != inputs.shape[1]:
            return None
        return mask
