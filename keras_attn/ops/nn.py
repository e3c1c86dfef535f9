"""`dot_product_attention` with the signature of `keras.ops.dot_product_attention`, on keras_attn's kernels.

A drop-in for code written against Keras's op: the same arguments, the same layout
`(batch, seq, heads, depth)`, grouped-query heads, a boolean `mask` and an additive `bias`
broadcastable to `(batch, heads, query_len, key_len)` (of any rank up to 4, as Keras broadcasts
them), `is_causal` and `scale`. What `flash_attention` means here:

- `True`: the streaming kernel (`keras_attn.kernels.blockwise`, TensorFlow backend): an online
  softmax over key blocks, and a backward pass that recomputes each block's weights, so neither
  the forward nor the backward pass ever holds the `(query_len, key_len)` weights. Keras's
  TensorFlow backend raises for it; `keras_attn.enable()` routes Keras's own switch here.
- `None`: `keras_attn`'s choice for the call by predicted cost (`implementation="auto"` of
  `keras_attn.scaled_dot_product_attention`).
- `False`: the dense kernel, the full weights, as Keras's non-flash path.

One difference from Keras: a query whose keys are all masked gets a zero output (Keras's dense
path gives it the mean of the values, its softmax over equal, finite, masked logits).
"""

import keras
from keras import ops

from keras_attn.core.attention import scaled_dot_product_attention
from keras_attn.validation import check_bool

_RANK = 4  # (batch, heads, query_len, key_len): what the mask and the bias broadcast to
# `flash_attention` -> the kernel of `scaled_dot_product_attention` that runs the call.
_IMPLEMENTATION = {True: "blockwise", None: "auto", False: "dense"}


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    scale=None,
    is_causal=False,
    flash_attention=None,
    attn_logits_soft_cap=None,
):
    """Scaled dot-product attention with `keras.ops.dot_product_attention`'s signature.

    Args:
        query: `(batch, query_len, heads, depth)`.
        key: `(batch, key_len, kv_heads, depth)`; `heads` a multiple of `kv_heads` (grouped-query
            attention, `kv_heads=1` multi-query).
        value: `(batch, key_len, kv_heads, value_depth)`.
        bias: optional additive bias broadcastable to `(batch, heads, query_len, key_len)`.
        mask: optional mask broadcastable to `(batch, heads, query_len, key_len)`, `True` (or
            non-zero) where a query may attend to a key.
        scale: the factor of the logits; defaults to `1 / sqrt(depth)`.
        is_causal: if `True`, query `i` attends only to keys `j <= i`.
        flash_attention: `True` for the streaming kernel (memory linear in the length, forward
            and backward; TensorFlow backend), `False` for the dense kernel, `None` (default) for
            keras_attn's choice by size.
        attn_logits_soft_cap: must be `None` (Keras supports it on JAX with TPUs only).

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype the three inputs promote to.

    Example:

    >>> q = k = v = keras.random.normal((2, 6, 4, 8))
    >>> tuple(dot_product_attention(q, k, v, is_causal=True, flash_attention=True).shape)
    (2, 6, 4, 8)
    """
    if attn_logits_soft_cap is not None:
        raise ValueError(
            "`attn_logits_soft_cap` is not supported (Keras supports it on JAX with TPUs only). "
            f"Received: attn_logits_soft_cap={attn_logits_soft_cap!r}"
        )
    check_bool("flash_attention", flash_attention, allow_none=True)
    query, key, value = ops.convert_to_tensor(query), ops.convert_to_tensor(key), ops.convert_to_tensor(value)
    dtype = keras.backend.result_type(query.dtype, key.dtype, value.dtype)
    if mask is not None:
        mask = ops.cast(_to_rank_4("mask", ops.convert_to_tensor(mask)), "bool")
    if bias is not None:
        bias = _to_rank_4("bias", ops.convert_to_tensor(bias, dtype=dtype))
    return scaled_dot_product_attention(
        ops.cast(query, dtype),
        ops.cast(key, dtype),
        ops.cast(value, dtype),
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        scale=scale,
        implementation=_IMPLEMENTATION[None if flash_attention is None else bool(flash_attention)],
    )


def _to_rank_4(name, tensor):
    """`tensor` with leading axes of 1 up to rank 4, as broadcasting reads a lower rank."""
    rank = len(tensor.shape)
    if rank > _RANK:
        raise ValueError(
            f"`{name}` must be broadcastable to (batch, heads, query_len, key_len): rank 4 at most. "
            f"Received: {name}.shape={tuple(tensor.shape)}"
        )
    for _ in range(_RANK - rank):
        tensor = ops.expand_dims(tensor, 0)
    return tensor
