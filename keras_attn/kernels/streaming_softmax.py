"""The softmax of the streaming kernels (chunked, blockwise, strided): exact at any inverse temperature.

A streaming kernel sees each query row's keys in pieces (chunks, blocks, a band and a residue
class) and never multiplies the inverse temperature `beta` into the query: `beta * q.k` overflows
float32 once it passes 3.4e38 (a large `beta`, large activations), and `inf - inf` is NaN. Like
the dense kernel (`keras_attn.core.softmax.shifted_logits`), it shifts first and scales after:

- the raw logits `s = q.k` are float32 (float64 for float64 inputs); a masked key's raw logit is
  `-inf` (`exclude`), so its weight `exp(-inf)` is exactly 0 at any `beta`, however small;
- each row keeps `M`, the largest raw logit of its allowed keys seen so far, and works with
  `z = beta * (s - M) + bias`, which is at most the bias (at most 0 without one);
- with an additive bias (`bias=`, a position bias) the row also keeps `m`, the running maximum of
  `z`, so that large or very negative biases neither overflow nor underflow the sum; without one
  `m` is 0 (the key at `M` has `z = 0`) and costs nothing;
- the statistics of a row are `(M, L)` with `L = m + log(sum exp(z - m))`: a weight is
  `exp(beta * (s - M) + bias - L)` (`weights`), which the backward passes recompute;
- a row without allowed keys keeps `M = -inf` and `L = -inf`, read through `finite_or_zero`, so it
  has zero weights, a zero output and a zero gradient, never NaN.

An inverse temperature at most 1 given as a Python number cannot overflow what `q.k` does not, so
it is folded into the query first (`fold_scale`: the kernels' fast path, no pass over the
logits to multiply them); the functions here take `scale=None` for "already in the logits".

A logit soft cap (`keras_attn.core.softmax.soft_capped`) is applied to the scaled raw logits,
`cap * tanh(beta * q.k / cap)`, before they are excluded or biased: `fold_scale` then always folds
`beta` into the query (the capped logits lie in `(-cap, cap)`, the shift is not needed for them),
`raw_logits` caps, and the backward passes multiply `dZ` by the cap's derivative (`cap_gradient`)
before it reaches the query and the key; the bias gradient stays `dZ` (the bias is added after).

The gradient of the logits `z` is `dZ = P * (dP - rowsum(dO * O))` (`logits_gradient`); the raw
logits get `beta * dZ`, so the query and key gradients are `beta * dZ K` and `beta * dZ^T Q`, and a
tensor `beta` gets `sum(Q * (dZ K))` (`scale_gradient`: `sum dZ * s` over the rows, whose shift
`M` drops out because each row of `dZ` sums to 0).
"""

import dataclasses
import numbers

import tensorflow as tf
from keras import ops

from keras_attn.core.softmax import soft_cap_derivative
from keras_attn.core.softmax import soft_capped
from keras_attn.utils import float_math_dtype


def fold_scale(query, scale, soft_cap=None):
    """`(query * scale, None)` for a Python number `scale <= 1` (`|scale * q.k| <= |q.k|`: it cannot
    overflow), else `(query, scale)` unchanged: the kernel then scales shifted logits. With a
    `soft_cap` any scale is folded (a tensor one too: its gradient flows through the product), since
    the capped logits are bounded whatever `scale * q.k` is."""
    # `convert_to_tensor` makes a Python number a tensor of the dtype directly (`tf.cast` of one
    # would round it through float32 first) and casts a tensor.
    if soft_cap is not None:
        return query * ops.convert_to_tensor(scale, query.dtype), None
    if isinstance(scale, numbers.Real) and scale <= 1:
        return query * ops.convert_to_tensor(scale, query.dtype), None
    return query, scale


def times_scale(scale, tensor):
    """`scale * tensor`, or `tensor` when the scale is already folded in (`scale=None`)."""
    return tensor if scale is None else ops.convert_to_tensor(scale, tensor.dtype) * tensor


def custom_gradient(forward, backward, scale, inputs):
    """`forward(scale, *inputs) -> (output, saved)` under `tf.custom_gradient` with `backward(scale,
    inputs, output, saved, output_gradient)`, which returns the gradients of `inputs`, preceded by
    that of `scale` when `scale` is a tensor (not folded: `None`)."""
    has_scale = scale is not None

    @tf.custom_gradient
    def attend(*flat):
        flat_scale, flat_inputs = (flat[0], flat[1:]) if has_scale else (None, flat)
        output, saved = forward(flat_scale, *flat_inputs)

        def gradient(output_gradient):
            return backward(flat_scale, flat_inputs, output, saved, output_gradient)

        return output, gradient

    return attend(*((scale,) if has_scale else ()), *inputs)


def raw_logits(query, key, soft_cap=None):
    """`query key^T` `(..., rows, keys)` in float32 (float64 for float64 inputs), soft-capped when
    `soft_cap` is given (the scale then already folded into `query`)."""
    logits = tf.matmul(query, key, transpose_b=True)
    return soft_capped(tf.cast(logits, float_math_dtype(logits.dtype)), soft_cap)


def cap_gradient(logits_gradient, capped, soft_cap):
    """`dZ` carried through the soft cap to the uncapped logits: `dZ * soft_cap_derivative(capped)`;
    `dZ` unchanged for `soft_cap=None`. `capped` may hold `-inf` where a key is excluded (its `dZ`
    is 0): the derivative is read as 0 there, never `0 * inf`."""
    if soft_cap is None:
        return logits_gradient
    derivative = soft_cap_derivative(capped, soft_cap)
    # A scalar zero, as `keras_attn.core.masks.zero_masked` selects.
    derivative = tf.where(tf.math.is_finite(capped), derivative, tf.zeros((), derivative.dtype))
    return logits_gradient * derivative


def exclude(logits, allowed):
    """Raw logits with `-inf` where not `allowed`: weight exactly 0 at any inverse temperature."""
    return tf.where(allowed, logits, tf.constant(-float("inf"), logits.dtype))


def finite_or_zero(row_statistic):
    """`-inf` (a row that has met no allowed key) read as 0, so that `-inf - -inf` never happens."""
    return tf.where(tf.math.is_inf(row_statistic), tf.zeros_like(row_statistic), row_statistic)


def _shifted(logits, scale, finite_row_max, bias=None):
    """`z = scale * (logits - row_max) + bias`: at most the bias on the rows' allowed keys, `-inf` where masked."""
    z = times_scale(scale, logits - finite_row_max)
    return z if bias is None else z + bias


@dataclasses.dataclass(frozen=True)
class RowStatistics:
    """The running softmax statistics of a set of rows `(..., rows, 1)` (see the module docstring).

    `row_max` is `M` (raw logits), `shift` is `m` (`None` without an additive bias: then 0),
    `total` is `sum exp(z - m)`.
    """

    row_max: object
    shift: object
    total: object

    @classmethod
    def empty(cls, shape, dtype, has_bias):
        """The statistics of rows that have seen no key: `M = m = -inf`, total 0."""
        minus_inf = tf.fill(shape, tf.constant(-float("inf"), dtype))
        return cls(minus_inf, minus_inf if has_bias else None, tf.zeros(shape, dtype))

    def log_normaliser(self):
        """`L = m + log(total)` `(..., rows, 1)`: a weight is `exp(z - L)`; `-inf` for a row without keys."""
        log_total = tf.math.log(self.total)  # -inf where no allowed key was met
        return log_total if self.shift is None else finite_or_zero(self.shift) + log_total


def update(statistics, logits, scale, bias=None):
    """One more piece of keys for the rows: the new statistics, the pieces' unnormalised weights
    `exp(z - m)` `(..., rows, keys)` and the factor `(..., rows, 1)` that rescales what the rows
    accumulated so far (online softmax, Milakov & Gimelshein 2018).

    Args:
        statistics: the rows' `RowStatistics` so far.
        logits: raw logits of the piece, `-inf` where masked (`raw_logits`).
        scale: the inverse temperature `beta` (a positive number or scalar tensor; `None`: in the logits).
        bias: optional additive float bias of the piece (`(..., rows, keys)`-broadcastable).
    """
    row_max = tf.maximum(statistics.row_max, tf.reduce_max(logits, -1, keepdims=True))
    finite_row_max = finite_or_zero(row_max)
    # beta * (M_old - M_new) <= 0: -inf (a factor of 0) while the row had met no allowed key.
    moved = times_scale(scale, statistics.row_max - finite_row_max)
    z = _shifted(logits, scale, finite_row_max, bias)  # (..., rows, keys)
    if statistics.shift is None:
        weights, factor, shift = tf.exp(z), tf.exp(moved), None
    else:
        shift = tf.maximum(statistics.shift + moved, tf.reduce_max(z, -1, keepdims=True))
        weights = tf.exp(z - finite_or_zero(shift))
        factor = tf.exp(statistics.shift + moved - finite_or_zero(shift))
    total = factor * statistics.total + tf.reduce_sum(weights, -1, keepdims=True)
    return RowStatistics(row_max, shift, total), weights, factor


def normalised(statistics, accumulated):
    """`accumulated / total` `(..., rows, depth)`; a row without allowed keys accumulated only zeros and stays 0."""
    total = statistics.total
    return accumulated * (1.0 / tf.where(total > 0, total, tf.ones_like(total)))


def softmax(logits, scale, bias=None):
    """The normalised weights `(..., rows, keys)` of whole rows of raw logits (`-inf` where masked)
    and their `(M, L)`; rows without allowed keys get zero weights.

    >>> import numpy as np
    >>> logits = tf.constant([[1e30, 1.000001e30, -np.inf], [-np.inf, -np.inf, -np.inf]])
    >>> softmax(logits, scale=3.4e38)[0].numpy().tolist()  # beta * logits would be inf - inf
    [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    empty = RowStatistics.empty(tf.shape(logits[..., :1]), logits.dtype, bias is not None)
    statistics, weights, _ = update(empty, logits, scale, bias)
    return normalised(statistics, weights), (statistics.row_max, statistics.log_normaliser())


def weights(logits, scale, row_max, log_normaliser, bias=None):
    """The normalised weights of raw logits from the rows' stored `(M, L)`: `exp(z - L)`, 0 where masked."""
    if scale is None:  # one pass: exp(logits + bias - (M + L))
        offset = finite_or_zero(row_max) + finite_or_zero(log_normaliser)  # (..., rows, 1)
        return tf.exp((logits if bias is None else logits + bias) - offset)
    return tf.exp(_shifted(logits, scale, finite_or_zero(row_max), bias) - finite_or_zero(log_normaliser))


def merge(parts, scale):
    """`(output, M, L)` of the same rows over disjoint sets of keys, merged into those of their union.

    Part `p` holds the share `exp(L_p + beta * (M_p - M))` of the union's sum (`M` the largest
    `M_p`); a part without allowed keys (`L_p = -inf`) holds none.
    """
    outputs, row_maxes, log_normalisers = zip(*parts)
    row_max = tf.reduce_max(tf.stack(row_maxes), 0)  # (..., rows, 1)
    shares = [
        norm + times_scale(scale, part_max - finite_or_zero(row_max))
        for part_max, norm in zip(row_maxes, log_normalisers)
    ]
    log_normaliser = tf.reduce_logsumexp(tf.stack(shares), 0)  # -inf for a row without allowed keys
    output = tf.add_n([part * tf.exp(share - finite_or_zero(log_normaliser)) for part, share in zip(outputs, shares)])
    return output, row_max, log_normaliser


def logits_gradient(weights, weights_gradient, delta):
    """`dZ = P * (dP - delta)`, the gradient of the logits `z` (and of an additive bias)."""
    return weights * (weights_gradient - delta)


def broadcast_bias_gradient(bias, logits_gradient):
    """A piece's `dZ` `(batch, heads, rows, keys)` summed over the axes `bias` broadcasts (size 1):
    the gradient of that piece of an additive bias."""
    summed_axes = [axis for axis in range(4) if bias.shape[axis] == 1]
    return tf.reduce_sum(logits_gradient, summed_axes, keepdims=True) if summed_axes else logits_gradient


def scale_gradient(query, query_side):
    """`d beta = sum(Q * (dZ K))` from the query and `dZ K` `(..., rows, depth)` of the same rows."""
    return tf.reduce_sum(tf.cast(query, query_side.dtype) * query_side)
