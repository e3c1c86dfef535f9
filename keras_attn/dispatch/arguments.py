"""The arguments of one attention call, checked: what `scaled_dot_product_attention` and
`explain_implementation` refuse, with the same errors (each names the argument and the value)."""

import keras

from keras_attn import patterns
from keras_attn.validation import check_bool
from keras_attn.validation import check_position
from keras_attn.validation import check_rate
from keras_attn.validation import check_same_batch
from keras_attn.validation import check_scale
from keras_attn.validation import check_soft_cap

_MASK_RANK = 4


def checked_pattern(
    query,
    key,
    value,
    *,
    mask,
    bias,
    is_causal,
    sliding_window,
    query_offset,
    scale,
    dropout_rate,
    training,
    return_weights,
    pattern,
    hard,
    logit_soft_cap,
):
    """Checks the arguments of `scaled_dot_product_attention` (tensors or `keras.KerasTensor`s of
    their shapes and dtypes) and returns the one pattern its shorthands and `pattern` make; a
    `ValueError` naming the first argument refused otherwise."""
    _check_inputs(query, key, value, mask)
    if bias is not None:
        _check_broadcastable("bias", bias, query, key)
    pattern = patterns.from_shorthands(pattern, is_causal, sliding_window)
    check_rate("dropout_rate", dropout_rate)
    check_bool("hard", hard)
    check_bool("is_causal", is_causal)  # a string or tensor would be truthy
    check_position("query_offset", query_offset)
    check_bool("return_weights", return_weights)
    check_bool("training", training, allow_none=True)
    check_scale(scale)
    check_soft_cap(logit_soft_cap)
    return pattern


def _check_inputs(query, key, value, mask):
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" not in dtype:  # integer logits would truncate: the softmax needs floats
            raise ValueError(f"`{name}` must be a floating tensor. Received: {name}.dtype={dtype}")
        if len(tensor.shape) != 4:
            raise ValueError(
                f"`{name}` must have rank 4 `(batch, seq, heads, depth)`. Received: {name}.shape={tuple(tensor.shape)}"
            )
    check_same_batch(query=query, key=key, value=value)
    if query.shape[-1] is not None and key.shape[-1] is not None:
        if query.shape[-1] != key.shape[-1]:
            raise ValueError(
                "`query` and `key` must have the same depth. Received: "
                f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
            )
    if key.shape[1] is not None and value.shape[1] is not None and key.shape[1] != value.shape[1]:
        raise ValueError(
            "`key` and `value` must have the same length. Received: "
            f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
    if key.shape[2] != value.shape[2]:
        raise ValueError(
            "`key` and `value` must have the same number of heads. Received: "
            f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
    query_heads, key_heads = query.shape[2], key.shape[2]
    if query_heads is not None and key_heads is not None and query_heads % key_heads:
        raise ValueError(
            "The number of query heads must be a multiple of the number of key/value heads. "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if mask is not None:
        _check_broadcastable("mask", mask, query, key)


def _check_broadcastable(name, tensor, query, key):
    if not hasattr(tensor, "shape"):
        raise ValueError(f"`{name}` must be a tensor. Received: {name}={tensor!r}")
    if name == "bias" and keras.backend.standardize_dtype(tensor.dtype) == "bool":
        raise ValueError("`bias` is added to the logits: a boolean one is a `mask`. Received: bias.dtype=bool")
    if len(tensor.shape) != _MASK_RANK:
        raise ValueError(
            f"`{name}` must have rank 4, broadcastable to (batch, heads, query_len, key_len). "
            f"Received: {name}.shape={tuple(tensor.shape)}"
        )
    target = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    for received, expected in zip(tensor.shape, target):
        if received not in (None, 1) and expected is not None and received != expected:
            raise ValueError(
                f"`{name}` is not broadcastable to (batch, heads, query_len, key_len)={target}. "
                f"Received: {name}.shape={tuple(tensor.shape)}"
            )
