"""The masked softmax every attention path shares: float32 logits, finite fills, exact zeros.

- logits and softmax in float32 whatever the compute dtype;
- masked logits are filled with the finite `MASK_FILL`, never `-inf` (which gives NaN in a fully
  masked row);
- masked entries, and every entry of a row without any attended key, are exactly 0;
- an additive bias at or below `MASK_FILL` (`-inf`, the dtype's lowest value, the `-1e9` idiom)
  masks its entry exactly like `mask=False` (`bias_mask`): its weight is 0, a row whose every key
  is masked so gets zero weights and a zero output, and no gradient is NaN.
"""

from keras import ops

from keras_attn.utils import float_math_dtype

# The finite logit of masked entries: `exp(MASK_FILL - m)` is exactly 0 for any real row maximum
# `m`, so only a row with no attended key at all needs its weights or output zeroed.
MASK_FILL = -1e9


def attention_logits(query, key, scale):
    """Logits `(batch, heads, query_len, key_len)` of `scale * query . key`, in `float_math_dtype`."""
    # `convert_to_tensor`, not `cast`: a Python float cast goes through float32 first.
    scale = ops.convert_to_tensor(scale, dtype=query.dtype)
    query = ops.multiply(query, scale)  # (batch, query_len, heads, depth)
    logits = ops.einsum("bqhd,bkhd->bhqk", query, key)  # (batch, heads, query_len, key_len)
    return ops.cast(logits, float_math_dtype(logits.dtype))


def bias_mask(bias):
    """`False` where the additive `bias` masks the key: at or below `MASK_FILL`, `-inf` included.

    Merged into the boolean mask before any kernel runs, so a `-inf` bias takes the masked path
    (finite fill, exact zeros, zeroed empty rows) instead of `-inf - -inf = NaN` in the softmax
    and its gradient. A NaN bias is not a mask: it stays visible in the output.

    >>> import numpy as np
    >>> bias_mask(np.array([0.0, -1e9, -np.inf, -1e8, np.nan], "float32")).numpy().tolist()
    [True, False, False, True, True]
    """
    bias = ops.convert_to_tensor(bias)
    bias = ops.cast(bias, float_math_dtype(bias.dtype))
    return ops.logical_not(ops.less_equal(bias, ops.cast(MASK_FILL, bias.dtype)))


def masked_softmax(logits, mask=None):
    """Float32 softmax over the last axis; masked entries and fully masked rows are exactly 0.

    Args:
        logits: float logits `(batch, heads, query_len, key_len)`.
        mask: optional boolean mask broadcastable to `logits`, `True` = attend.
    """
    logits = ops.cast(logits, float_math_dtype(logits.dtype))
    if mask is None:
        return ops.softmax(logits, axis=-1)
    weights = ops.softmax(fill_masked(logits, mask), axis=-1)  # (batch, heads, q, k)
    return zero_masked(weights, mask)


def fill_masked(logits, mask):
    """Masked logits replaced by `MASK_FILL`: `-inf` would give NaN (inf - inf) in a fully masked row."""
    return ops.where(mask, logits, ops.cast(MASK_FILL, logits.dtype))


def zero_masked(weights, mask):
    """Exact zeros at masked entries: a fully masked row would otherwise softmax to uniform weights."""
    return ops.where(mask, weights, ops.zeros_like(weights))
