"""`dot_product_attention` with the signature of `keras.ops.dot_product_attention`, on keras_attn's kernels.

A drop-in for code written against Keras's op: the same arguments, the same layout
`(batch, seq, heads, depth)`, grouped-query heads, a boolean `mask` and an additive `bias`
broadcastable to `(batch, heads, query_len, key_len)` (of any rank up to 4, as Keras broadcasts
them), `is_causal` and `scale`. What `flash_attention` means here:

- `True`: the streaming kernel (`keras_attn.kernels.blockwise`, TensorFlow backend): an online
  softmax over key blocks, and a backward pass that recomputes each block's weights, so neither
  the forward nor the backward pass ever holds the `(query_len, key_len)` weights. Keras's
  TensorFlow backend raises for it; `keras_attn.enable()` routes Keras's own switch here.
- `None`: `keras_attn`'s choice for the call by measured cost (`implementation="auto"` of
  `keras_attn.scaled_dot_product_attention`).
- `False`: the dense kernel, the full weights, as Keras's non-flash path.

A query whose keys are all masked gets what Keras's op gives it: the mean of the values over all
the keys (Keras fills masked logits with one finite value, `-0.7 * 3.38953e38`, after the bias, so
such a row softmaxes to uniform weights), with Keras's gradient (the values get `dO / key_len`,
the query, key and bias nothing from that row). The kernel still computes the row as keras_attn's
layers do (a zero output: `keras_attn.scaled_dot_product_attention`'s contract, which they keep);
this op then puts the mean in its place (`keras_attn.core.masks.keras_rows_without_keys`), on every kernel.

Where Keras gives no result or refuses, this op differs: a bias entry at or below `-1e9` (`-inf`
included) masks its key like `mask=False` (Keras: NaN for a row of `-inf`, and a float32 rounding
of the other logits for `-1e9`; its row, if every key is so masked, gets the mean of the values);
`flash_attention=True` runs (Keras's TensorFlow backend raises); `attn_logits_soft_cap` runs
(Keras refuses it outside JAX on TPUs).
"""

import keras
from keras import ops

from keras_attn.core.masks import keras_rows_without_keys
from keras_attn.core.masks import merge_masks
from keras_attn.core.softmax import bias_mask
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.validation import check_bool
from keras_attn.validation import check_soft_cap

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
        attn_logits_soft_cap: optional number, a normal float32 (`[1.18e-38, 3.4e38]`): the logits become
            `tanh(scale * Q K^T / cap) * cap` before the bias and the mask (Gemma 2's soft-capping;
            `keras_attn.scaled_dot_product_attention`'s `logit_soft_cap`). Keras runs it on JAX
            with TPUs only.

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype the three inputs promote to; a query
        whose keys are all masked gets the mean of the values over all keys, as in Keras.

    Example:

    >>> q = k = v = keras.random.normal((2, 6, 4, 8))
    >>> tuple(dot_product_attention(q, k, v, is_causal=True, flash_attention=True).shape)
    (2, 6, 4, 8)
    """
    check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap")
    flash_attention = check_bool("flash_attention", flash_attention, allow_none=True)
    query, key, value = ops.convert_to_tensor(query), ops.convert_to_tensor(key), ops.convert_to_tensor(value)
    dtype = keras.backend.result_type(query.dtype, key.dtype, value.dtype)
    if mask is not None:
        mask = ops.cast(_to_rank_4("mask", ops.convert_to_tensor(mask)), "bool")
    if bias is not None:
        bias = _to_rank_4("bias", ops.convert_to_tensor(bias, dtype=dtype))
    query, key, value = ops.cast(query, dtype), ops.cast(key, dtype), ops.cast(value, dtype)
    output = scaled_dot_product_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        scale=scale,
        logit_soft_cap=attn_logits_soft_cap,
        implementation=_IMPLEMENTATION[flash_attention],
    )
    allowed = mask if bias is None else merge_masks(mask, bias_mask(bias))
    if allowed is None:  # a causal mask alone leaves every query key 0
        return output
    return keras_rows_without_keys(output, value, allowed, is_causal, ops.shape(query)[1], ops.shape(key)[1])


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
