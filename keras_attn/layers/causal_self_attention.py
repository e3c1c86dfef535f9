"""Causal (masked) self-attention: position `i` attends only to positions `j <= i`."""

import keras

from keras_attn.layers.self_attention import SelfAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalSelfAttention(SelfAttention):
    """Multi-head causal self-attention, the masked attention of a decoder.

    `CausalSelfAttention(...)(x)` is `MultiHeadAttention(...)(x, x, use_causal_mask=True)`;
    the constructor arguments and weights are those of `MultiHeadAttention`. For incremental
    decoding pass a key/value `cache` of shape `(batch, 2, max_len, kv_heads, key_dim)` and
    the `cache_update_index` of the new tokens: the call returns `(output, cache)`.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each attention head for query and key.
        **kwargs: every other constructor argument of `keras_attn.MultiHeadAttention`.

    Call arguments: those of `SelfAttention` (`value=None`), always causal
    (`use_causal_mask` need not be passed); with a cache the padding masks cover `max_len`.
    With `segment_ids` each document of a packed row is causal within itself; decoding a packed
    prompt passes the new tokens' `query_segment_ids` and the cache's `key_segment_ids`, kept
    with `next_cache_segment_ids` (a document continues as if alone in its row).

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> layer = CausalSelfAttention(num_heads=4, key_dim=8)
    >>> full = layer(x)
    >>> cache = keras.ops.zeros((2, 2, 10, 4, 8))
    >>> first, cache = layer(x[:, :1], cache=cache, cache_update_index=0)
    >>> bool(keras.ops.all(keras.ops.abs(first - full[:, :1]) < 1e-5))  # the first token sees only itself
    True
    """

    causal = True
