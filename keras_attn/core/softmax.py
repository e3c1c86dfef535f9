"""The masked softmax every attention path shares: float32 logits, exact masking, exact zeros.

- logits (Q . K^T included) and softmax in float32 whatever the compute dtype: float16 products
  overflow at 65,504;
- masked entries are excluded, never out-competed: their logit is the dtype's lowest finite value
  (`mask_fill`), below every allowed logit, so their weight is exactly 0 whatever the scale of
  the allowed logits (a fill such as `-1e9` loses to allowed logits below it); a row with no
  allowed key at all gets zero weights and a zero output;
- the inverse temperature multiplies logits already shifted by their row maximum
  (`shifted_logits`), so `beta * (l - max l)` lies in `[-inf, 0]`: no `beta` up to the float32
  limit overflows to `inf` or NaN (a Python `beta <= 1` cannot overflow what `l` does not, and
  multiplies the logits directly);
- a logit soft cap (`soft_capped`, Gemma 2's `tanh(logits / cap) * cap`) bounds the scaled logits
  to `(-cap, cap)` before any bias or mask: they cannot overflow, so they need no shift;
- an additive bias at or below `MASKING_BIAS` (`-inf`, the dtype's lowest value, the `-1e9`
  idiom) masks its entry exactly like `mask=False` (`bias_mask`): its weight is 0, a row whose
  every key is masked so gets zero weights and a zero output, and no gradient is NaN.
"""

import math
import numbers

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_attn.core.masks import zero_masked
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_broadcastable

# An additive bias at or below this value is a mask (the `-1e9` idiom of Keras and Transformers
# code, `-inf`, a dtype's lowest value): `bias_mask` turns it into `mask=False`.
MASKING_BIAS = -1e9


def default_scale(depth):
    """The inverse temperature of every attention entry point given `scale=None`: `1 / sqrt(depth)`,
    `depth` the query/key size per head (Vaswani et al., 2017; Keras's `1 / sqrt(key_dim)`).

    >>> default_scale(64)
    0.125
    """
    return 1.0 / math.sqrt(depth)


def resolved_scale(scale, depth):
    """`scale`, or `default_scale(depth)` when it is `None`."""
    return default_scale(depth) if scale is None else scale


def attention_logits(query, key):
    """Unscaled logits `(batch, heads, query_len, key_len)` of `query . key`, in `float_math_dtype`.

    Query and key are cast first (no op when they are float32 already), so the products and their
    sums are float32 under mixed precision. `key` may have fewer heads than `query`, a divisor of
    them (grouped-query attention): query head `h` meets key head `h // groups`, as if the key heads
    were repeated, without the copy of the keys a repeat makes (KerasHub Gemma's own product).

    The product is one einsum op (`_einsum`), as Keras's `dot_product_attention` computes it; the
    grouped one a matmul of each key head's queries, `(batch, key_heads, groups * query_len, depth)`.
    """
    dtype = float_math_dtype(query.dtype)
    query, key = ops.cast(query, dtype), ops.cast(key, dtype)
    groups = grouped_heads(query, key)
    if groups == 1:
        return _einsum("bqhd,bkhd->bhqk", query, key)  # (batch, heads, query_len, key_len)
    batch, query_len, heads, depth = ops.shape(query)
    key_heads = heads // groups
    query = ops.reshape(query, (batch, query_len, key_heads, groups, depth))
    query = ops.reshape(ops.transpose(query, (0, 2, 3, 1, 4)), (batch, key_heads, groups * query_len, depth))
    logits = ops.matmul(query, ops.transpose(key, (0, 2, 3, 1)))  # (batch, key_heads, groups * query_len, key_len)
    return ops.reshape(logits, (batch, heads, query_len, ops.shape(key)[1]))


def weighted_values(weights, value):
    """`(batch, query_len, heads, value_depth)`: the `weights (batch, heads, query_len, key_len)`
    times `value (batch, key_len, key_heads, value_depth)`, `key_heads` a divisor of `heads` as in
    `attention_logits` (no repeat of the values), one einsum op (`_einsum`) or, grouped, one matmul."""
    groups = weights.shape[1] // value.shape[2]
    if groups == 1:
        return _einsum("bhqk,bkhd->bqhd", weights, value)
    batch, heads, query_len, key_len = ops.shape(weights)
    key_heads, value_depth = heads // groups, ops.shape(value)[-1]
    weights = ops.reshape(weights, (batch, key_heads, groups * query_len, key_len))
    output = ops.matmul(weights, ops.transpose(value, (0, 2, 1, 3)))  # (batch, key_heads, groups * query_len, depth)
    output = ops.reshape(output, (batch, key_heads, groups, query_len, value_depth))
    return ops.reshape(ops.transpose(output, (0, 3, 1, 2, 4)), (batch, query_len, heads, value_depth))


def _einsum(equation, first, second):
    """`ops.einsum(equation, first, second)` of two operands of one dtype. Keras's op (transposes
    around a matmul on TensorFlow), not a fused `tf.einsum`: the exported graph's ONNX attention
    fuser (`export/onnx_fused_attention.py`) matches the matmul pattern."""
    return ops.einsum(equation, first, second)


def grouped_heads(query, key):
    """How many query heads share each key/value head: `query.shape[2] // key.shape[2]` (1 unless grouped)."""
    return query.shape[2] // key.shape[2]


def shifted_logits(logits, scale, mask=None):
    """`scale * (logits - m)`, `m` each row's largest allowed logit: softmax-equal to `scale * logits`.

    `logits - m <= 0` on allowed keys, so the product lies in `[-inf, 0]` for any positive
    `scale` up to the float32 limit and its row maximum is exactly 0. `m` is a constant of the
    softmax (no gradient flows through it); a row without allowed keys takes `m = 0`.
    """
    if _is_number_at_most_one(scale):
        # `|scale * l| <= |l|` cannot overflow: no shift needed (the softmax shifts)
        return logits if scale == 1 else logits * scale
    fill = mask_fill(logits.dtype)
    allowed = logits if mask is None else ops.where(mask, logits, fill)
    row_max = ops.max(allowed, axis=-1, keepdims=True, initial=fill)  # (..., 1); `initial`: empty inputs
    row_max = ops.stop_gradient(ops.where(row_max > fill, row_max, ops.zeros_like(row_max)))
    scale = ops.convert_to_tensor(scale, dtype=logits.dtype)
    return ops.multiply(scale, logits - row_max)


def soft_capped(logits, soft_cap):
    """`tanh(logits / soft_cap) * soft_cap` (Gemma 2's logit soft-capping, FlashAttention's `softcap`):
    the logits squashed smoothly into `(-soft_cap, soft_cap)`; `logits` unchanged for `soft_cap=None`.
    Applied to `scale * Q K^T` before the bias and the mask are added, as Gemma does; its derivative
    is `soft_cap_derivative`.

    Accurate to the dtype's rounding for every logit and every cap that `check_soft_cap` accepts
    (the normal float32 numbers): a logit below `soft_cap * sqrt(eps)` is its own capped value
    (`tanh(t) = t` to the last bit for `t` that small), so `logits / soft_cap` is never computed
    where it would fall below the smallest normal float (flushed to 0 on CPUs, for a cap above 1);
    and the gradient is `soft_cap_derivative`, never `upstream * soft_cap / soft_cap`, which
    overflows for a large cap and flushes to 0 for a small one.

    >>> [round(x, 4) for x in soft_capped(np.array([0.0, 1.0, 1e6]), 5.0).numpy().tolist()]
    [0.0, 0.9869, 5.0]
    """
    if soft_cap is None:
        return logits
    logits = ops.convert_to_tensor(logits)
    dtype = keras.backend.standardize_dtype(logits.dtype)
    cap = ops.convert_to_tensor(soft_cap, dtype)  # from a Python float: no float32 rounding on the way
    below_rounding = soft_cap * math.sqrt(float(np.finfo(dtype).eps))  # tanh(t) * cap rounds to t * cap

    @ops.custom_gradient
    def _capped(logits):
        linear = ops.less(ops.abs(logits), ops.cast(below_rounding, dtype))
        capped = ops.where(linear, logits, ops.multiply(ops.tanh(ops.divide(logits, cap)), cap))

        def gradient(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            return upstream * soft_cap_derivative(capped, soft_cap)

        return capped, gradient

    return _capped(logits)


def soft_cap_derivative(capped, soft_cap):
    """The derivative of `soft_capped` at the logits whose capped values are `capped`:
    `1 - (capped / soft_cap)^2`, from `capped` (within `[-soft_cap, soft_cap]`, so the quotient
    cannot overflow) instead of from the logits."""
    return 1.0 - ops.square(ops.divide(capped, ops.convert_to_tensor(soft_cap, capped.dtype)))


def query_with_scale(query, scale):
    """`(query, scale)` for `shifted_logits`: a Python `scale <= 1` moved onto the query.

    Such a scale cannot overflow the logits, so it multiplies the `float_math_dtype` query before
    `Q K^T`, as Keras's layer does, instead of a pass over the `(batch, heads, query_len, key_len)`
    logits that would hold a second tensor of their size; the logits then take `scale=1`. Any other
    scale (above 1, a tensor) is returned for `shifted_logits` to apply after the shift.

    >>> query, scale = query_with_scale(np.ones((1, 1, 1, 2), "float16"), 0.5)
    >>> keras.backend.standardize_dtype(query.dtype), query.numpy().tolist(), scale
    ('float32', [[[[0.5, 0.5]]]], 1)
    """
    if not _is_number_at_most_one(scale):
        return query, scale
    return ops.multiply(ops.cast(query, float_math_dtype(query.dtype)), scale), 1


def _is_number_at_most_one(scale):
    return isinstance(scale, numbers.Real) and not isinstance(scale, bool) and scale <= 1


def mask_fill(dtype):
    """The logit of masked entries: `dtype`'s lowest finite value, below every allowed logit.

    `exp(fill - m)` is exactly 0 for any allowed row maximum `m` above it, so masking never depends
    on the scale of the logits (a fill such as `-1e9` loses to allowed logits below it). Finite, not
    `-inf`: a fully masked row stays finite, and tf2onnx lowers `where` to arithmetic in which
    `0 * inf` would be NaN.

    >>> float(mask_fill("float32"))
    -3.4028234663852886e+38
    """
    return ops.convert_to_tensor(np.finfo(keras.backend.standardize_dtype(dtype)).min, dtype=dtype)


def bias_mask(bias):
    """`False` where the additive `bias` masks the key: at or below `MASKING_BIAS`, `-inf` included.

    Merged into the boolean mask before any kernel runs, so a `-inf` bias takes the masked path
    (excluded keys, exact zeros, zeroed empty rows) instead of `-inf - -inf = NaN` in the softmax
    and its gradient. A NaN bias is not a mask: it stays visible in the output.

    >>> import numpy as np
    >>> bias_mask(np.array([0.0, -1e9, -np.inf, -1e8, np.nan], "float32")).numpy().tolist()
    [True, False, False, True, True]
    """
    bias = ops.convert_to_tensor(bias)
    bias = ops.cast(bias, float_math_dtype(bias.dtype))
    return ops.logical_not(ops.less_equal(bias, ops.cast(MASKING_BIAS, bias.dtype)))


def softmax(logits, axis=-1):
    """TensorFlow's softmax of `logits` over `axis`. Not `keras.ops.softmax`, which warns whenever the
    axis has size 1 (a row with one key: a one-token input, a first decoding step), a valid call."""
    return tf.nn.softmax(logits, axis=axis)


def masked_softmax(logits, mask=None):
    """Float32 softmax over the last axis; masked entries and fully masked rows are exactly 0.

    Args:
        logits: float logits `(batch, heads, query_len, key_len)`.
        mask: optional boolean mask broadcastable to `logits` (without changing their shape; a
            `ValueError` says so), `True` = attend.

    Example:

    >>> import numpy as np
    >>> masked_softmax(np.array([[1.0, 1.0, 5.0], [2.0, 0.0, 0.0]]),
    ...                np.array([[True, True, False], [False, False, False]])).numpy().tolist()
    [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    """
    check_broadcastable(mask=mask, to="logits", logits=logits)
    logits = ops.cast(logits, float_math_dtype(logits.dtype))
    if mask is None:
        return softmax(logits)
    weights = softmax(fill_masked(logits, mask))  # (batch, heads, q, k)
    return zero_masked(weights, mask)


def softmax_with_exact_saturated_gradient(logits, softmax):
    """`softmax(logits)` over the last axis, differentiated as `P * (dP * rowsum(P) - rowsum(P * dP))`.

    That is the usual `P * (dP - rowsum(P * dP))` with `dP` times the row's weight sum, which is 1 in
    exact arithmetic. Why: a fused softmax may return a one-hot row's 1 as `1 - 2**-24` (oneDNN on
    CPUs with AMX), and the usual formula then leaves `2**-24 * dP` instead of 0, which the inverse
    temperature (up to the float32 limit, applied after the shift by `shifted_logits`) turns into
    inf. In this form a row with a single nonzero weight `p` cancels exactly, `p * dP - p * dP`,
    whatever `p` rounded to. `softmax` is the forward function of `logits`.

    The backward pass holds no more full-size tensors than the usual formula's: `dP * rowsum(P)` runs
    after `rowsum(P * dP)` has read `dP`, so TensorFlow writes it into `dP`'s buffer instead of a new
    one (run earlier, it finds `dP` still awaited and takes a `(batch, heads, query_len, key_len)` more).
    """

    @ops.custom_gradient
    def _softmax(logits):
        weights = softmax(logits)

        def gradient(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            total = ops.sum(weights, axis=-1, keepdims=True)
            weighted = ops.sum(weights * upstream, axis=-1, keepdims=True)
            with tf.control_dependencies([weighted]):  # `upstream`'s last reader: its buffer is reused
                rescaled = upstream * total
            return weights * (rescaled - weighted)

        return weights, gradient

    return _softmax(logits)


def fill_masked(logits, mask):
    """Masked logits replaced by `mask_fill` (weight exactly 0 at any logit scale).

    >>> import numpy as np
    >>> logits = np.array([-3e30, -1e30, 5.0], "float32")
    >>> masked_softmax(logits, np.array([True, True, False])).numpy().tolist()
    [0.0, 1.0, 0.0]
    """
    return ops.where(mask, logits, mask_fill(logits.dtype))
