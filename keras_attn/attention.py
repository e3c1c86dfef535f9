"""Scaled dot-product attention: the one attention core every layer plugs into.

Every attention family in keras_attn reaches the softmax through this module. A family contributes
a boolean mask (padding, causal, band, strided, ...), an additive bias (ALiBi, relative positions)
or both; the core owns the numerics that must be identical everywhere:

- logits and softmax in float32 whatever the compute dtype;
- masked logits are filled with a finite value, never `-inf`;
- a query row whose keys are all masked gets all-zero weights and a zero output, on every path;
- attention dropout is applied to the normalised weights.

Layout: `(batch, seq, heads, depth)` for query, key and value (what the projections of
`MultiHeadAttention` produce, no transposes needed); masks and biases broadcast to
`(batch, heads, query_len, key_len)`.
"""

import math
import numbers

import keras
from keras import ops

from keras_attn.blockwise_attention import blockwise_attention
from keras_attn.chunked_attention import chunked_attention
from keras_attn.softmax import attention_logits
from keras_attn.softmax import fill_masked
from keras_attn.softmax import zero_masked
from keras_attn import patterns
from keras_attn.masks import may_empty_rows
from keras_attn.masks import pattern_mask
from keras_attn.utils import check_rate

_MASK_RANK = 4
ATTENTION_IMPLEMENTATIONS = ("auto", "dense", "chunked", "blockwise")
# `implementation="auto"` switches to blockwise attention (memory linear in the length) from
# `query_len * key_len` this large. Below the banded threshold the chunked path takes causal/band
# attention: benchmarks/layer_throughput.py measured it faster than blockwise (and than dense and
# Keras) at every length from 256 to 4096 without XLA (1.3x to 2.2x Keras, blockwise 1.0x to
# 1.6x); it keeps each chunk's weights for the backward pass, so from 8192 (over 1 GB per
# sequence) blockwise takes over.
BLOCKWISE_MIN_ATTENTION_SIZE = 2048 * 2048
BLOCKWISE_MIN_BANDED_ATTENTION_SIZE = 8192 * 8192
# Queries per chunk of the chunked path: each chunk computes only the keys its band reaches.
QUERY_CHUNK_SIZE = 128
def _check_inputs(query, key, value, mask):
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" not in dtype:  # integer logits would truncate: the softmax needs floats
            raise ValueError(f"`{name}` must be a floating tensor. Received: {name}.dtype={dtype}")
        if len(tensor.shape) != 4:
            raise ValueError(
                f"`{name}` must have rank 4 `(batch, seq, heads, depth)`. "
                f"Received: {name}.shape={tuple(tensor.shape)}"
            )
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


def _check_scale(scale):
    """A number must be positive and finite (a tensor scale is only known at run time)."""
    if scale is None or (hasattr(scale, "dtype") and not isinstance(scale, numbers.Real)):
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        raise ValueError(f"`scale` must be a positive finite number or None. Received: scale={scale!r}")


def _zero_unattended_keys(key, value, mask):
    """Keys and values that no query may attend to (padding) set to 0: whatever they hold, NaN
    and inf included, cannot reach a real output through `0 * NaN` in the logits or the value
    product of any kernel."""
    attended = ops.any(mask, axis=(1, 2))  # (batch | 1, key_len)
    attended = ops.expand_dims(ops.expand_dims(attended, -1), -1)  # (batch | 1, key_len, 1, 1)
    return ops.where(attended, key, ops.zeros_like(key)), ops.where(attended, value, ops.zeros_like(value))


def _repeat_kv_heads(tensor, groups):
    """`(batch, seq, kv_heads, depth)` -> `(batch, seq, kv_heads * groups, depth)`."""
    if groups == 1:
        return tensor
    return ops.repeat(tensor, groups, axis=2)


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    is_causal=False,
    sliding_window=None,
    query_offset=0,
    scale=None,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    return_weights=False,
    implementation="auto",
    pattern=None,
):
    """Scaled dot-product attention, `softmax(scale * Q K^T + bias) V`, with exact masking.

    Args:
        query: `(batch, query_len, heads, depth)`.
        key: `(batch, key_len, kv_heads, depth)`; `heads` must be a multiple of `kv_heads`
            (grouped-query attention; `kv_heads=1` is multi-query attention).
        value: `(batch, key_len, kv_heads, value_depth)`.
        mask: optional boolean tensor broadcastable to `(batch, heads, query_len, key_len)`,
            `True` where a query may attend to a key.
        bias: optional additive float bias broadcastable to
            `(batch, heads, query_len, key_len)`, added to the logits in float32.
        is_causal: if `True`, query `i` attends only to keys `j <= i` (top-left aligned);
            shorthand for `pattern=keras_attn.patterns.Causal()`.
        sliding_window: optional positive int; query `i` attends only to keys with
            `|i - j| < sliding_window`; shorthand for `pattern=SlidingWindow(sliding_window)`.
        query_offset: position (>= 0) of the first query among the keys (an int or a scalar int
            tensor) for the pattern; non-zero in cached decoding, where the queries are the
            newest tokens of a longer key/value cache.
        scale: logit scale; defaults to `1 / sqrt(depth)`.
        dropout_rate: dropout applied to the attention weights when `training`.
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for dropout (one is made if `None`).
        return_weights: if `True`, also return the attention weights (normalised, before
            dropout, as `keras.layers.MultiHeadAttention` returns its scores).
        implementation: `"dense"` materialises the `(query_len, key_len)` weights (the
            reference); `"chunked"` (TensorFlow backend; a pattern, static lengths, an int
            `query_offset`, and a mask/bias with static query and key dimensions) uses
            `keras_attn.chunked_attention`: queries in chunks of `QUERY_CHUNK_SIZE`, each over
            only the keys the pattern lets it reach (about half the work of `"dense"` under a
            causal mask), with a written-out gradient, same numerics;
            `"blockwise"` (TensorFlow backend) uses
            `keras_attn.blockwise_attention`, memory linear in the length, skipping the key
            blocks the pattern excludes, same numerics;
            `"auto"` picks blockwise on the TensorFlow backend when the static
            `query_len * key_len` reaches `BLOCKWISE_MIN_ATTENTION_SIZE`
            (`BLOCKWISE_MIN_BANDED_ATTENTION_SIZE` with a pattern), else
            chunked when it applies and `query_len >= 2 * QUERY_CHUNK_SIZE`, else dense; dense
            whenever `return_weights`.
        pattern: optional `keras_attn.patterns.Pattern` (or its config): which keys each
            query position may attend to; intersected with `is_causal` and `sliding_window`.

    Returns:
        The output `(batch, query_len, heads, value_depth)` in the dtype of `value`, and, when
        `return_weights`, the weights `(batch, heads, query_len, key_len)` in the same dtype.
        A query row whose keys are all masked has all-zero weights and a zero output.

    Example:

    >>> q = k = v = keras.random.normal((2, 5, 4, 8))
    >>> out, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    >>> tuple(out.shape), tuple(w.shape)
    ((2, 5, 4, 8), (2, 4, 5, 5))
    """
    _check_inputs(query, key, value, mask)
    if bias is not None:
        _check_broadcastable("bias", bias, query, key)
    pattern = patterns.from_shorthands(pattern, is_causal, sliding_window)
    check_rate("dropout_rate", dropout_rate)
    if isinstance(query_offset, int) and query_offset < 0:
        raise ValueError(f"`query_offset` must be >= 0. Received: query_offset={query_offset}")
    _check_scale(scale)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if mask is not None:
        key, value = _zero_unattended_keys(key, value, mask)

    groups = query.shape[2] // key.shape[2]
    key = _repeat_kv_heads(key, groups)  # (batch, key_len, heads, depth)
    value = _repeat_kv_heads(value, groups)  # (batch, key_len, heads, value_depth)
    path = _choose_implementation(implementation, query, key, mask, bias, pattern, query_offset, return_weights)
    if path == "blockwise":
        return blockwise_attention(
            query, key, value, mask=mask, bias=bias, pattern=pattern, query_offset=query_offset, scale=scale,
            dropout_rate=dropout_rate, training=training, seed_generator=seed_generator,
        )

    dropout_rate = dropout_rate if training else 0.0
    if path == "chunked":
        return chunked_attention(
            query, key, value, mask=mask, bias=bias, pattern=pattern, query_offset=query_offset, scale=scale,
            dropout_rate=dropout_rate, seed_generator=seed_generator, chunk_size=QUERY_CHUNK_SIZE,
        )
    return _dense_attention(
        query, key, value, mask, bias, pattern, query_offset, scale, dropout_rate, seed_generator, return_weights,
    )


def _dense_attention(
    query, key, value, mask, bias, pattern, query_offset, scale, dropout_rate, seed_generator, return_weights,
):
    """Attention through the full `(query_len, key_len)` weights of `mask` merged with the pattern.

    Masked logits get a finite fill, so a partly masked row's masked weights underflow to exactly
    0. A fully masked row softmaxes to uniform weights: its output is zeroed after the value
    product (a boolean reduction of the mask and a pass over `(batch, query_len, heads, depth)`
    instead of a float pass over the weights), and
    the weights are zeroed only when they are returned. A causal mask alone never empties a row
    (query `i` always sees key 0), so it needs neither.
    """
    rows_may_be_empty = may_empty_rows(mask, pattern)
    mask = pattern_mask(mask, pattern, ops.shape(query)[1], ops.shape(key)[1], query_offset)
    logits = attention_logits(query, key, scale)  # (batch, heads, query_len, key_len)
    if bias is not None:
        logits = logits + ops.cast(bias, logits.dtype)
    if mask is not None:
        logits = fill_masked(logits, mask)
    weights = ops.softmax(logits, axis=-1)  # (batch, heads, query_len, key_len), float32
    dropped = weights
    if dropout_rate > 0.0:
        dropped = keras.random.dropout(weights, dropout_rate, seed=seed_generator)
    dropped = ops.cast(dropped, value.dtype)
    output = ops.einsum("bhqk,bkhd->bqhd", dropped, value)  # (batch, query_len, heads, value_depth)
    if rows_may_be_empty:
        output = _zero_rows_without_keys(output, mask)
    if return_weights:
        weights = zero_masked(weights, mask) if rows_may_be_empty else weights
        return output, ops.cast(weights, value.dtype)
    return output


def _zero_rows_without_keys(output, mask):
    """Zeros the output `(batch, query_len, heads, depth)` of query rows whose keys are all masked."""
    has_keys = ops.any(mask, axis=-1)  # (batch | 1, heads | 1, query_len | 1)
    has_keys = ops.expand_dims(ops.transpose(has_keys, (0, 2, 1)), -1)  # (batch | 1, query_len | 1, heads | 1, 1)
    return ops.where(has_keys, output, ops.zeros_like(output))


def _choose_implementation(implementation, query, key, mask, bias, pattern, query_offset, return_weights):
    """`"dense"`, `"chunked"` or `"blockwise"`: the path `implementation` resolves to for these inputs."""
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {ATTENTION_IMPLEMENTATIONS}. Received: implementation={implementation!r}"
        )
    if return_weights and implementation in ("chunked", "blockwise"):
        raise ValueError(
            f"`implementation={implementation!r}` never materialises the whole attention matrix: it cannot "
            "be combined with `return_weights=True`. Received: return_weights=True"
        )
    on_tensorflow = keras.backend.backend() == "tensorflow"
    if implementation in ("chunked", "blockwise") and not on_tensorflow:
        raise ValueError(
            f"`implementation={implementation!r}` needs the TensorFlow backend. "
            f"Received: implementation={implementation!r} with backend {keras.backend.backend()!r}"
        )
    if implementation == "chunked":
        unchunkable = _why_not_chunked(query, key, mask, bias, pattern, query_offset)
        if unchunkable:
            raise ValueError(f"`implementation='chunked'` needs {unchunkable}")
    if implementation != "auto":
        return implementation
    if return_weights:
        return "dense"
    query_len, key_len = query.shape[1], key.shape[1]
    threshold = BLOCKWISE_MIN_BANDED_ATTENTION_SIZE if pattern is not None else BLOCKWISE_MIN_ATTENTION_SIZE
    if (
        on_tensorflow
        and query_len is not None
        and key_len is not None
        and query_len * key_len >= threshold
    ):
        return "blockwise"
    chunkable = on_tensorflow and not _why_not_chunked(query, key, mask, bias, pattern, query_offset)
    if chunkable and query_len >= 2 * QUERY_CHUNK_SIZE:
        return "chunked"
    return "dense"


def _why_not_chunked(query, key, mask, bias, pattern, query_offset):
    """Why the chunked path cannot take these inputs (a message), or `None` when it can."""
    if pattern is None:
        return (
            "an attention pattern (`pattern=`, `is_causal=True` or a `sliding_window`). "
            "Received: pattern=None, is_causal=False, sliding_window=None"
        )
    if query.shape[1] is None or key.shape[1] is None:
        return f"static lengths. Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
    if isinstance(query_offset, bool) or not isinstance(query_offset, int):
        return f"a Python int `query_offset`. Received: query_offset={query_offset!r}"
    for name, pairwise in (("mask", mask), ("bias", bias)):
        if pairwise is not None and None in tuple(pairwise.shape)[2:]:
            return f"`{name}` with static query and key dimensions. Received: {name}.shape={tuple(pairwise.shape)}"
    return None
