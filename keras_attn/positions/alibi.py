"""ALiBi: attention with linear biases (Press et al., 2022)."""

import math

import keras
import numpy as np
from keras import ops

from keras_attn.core.position_bias import PositionBias
from keras_attn.core.position_bias import relative_positions


def alibi_slopes(num_heads):
    """The paper's head slopes, a geometric sequence; a list of `num_heads` floats.

    For a power of two `n`: `2^(-8/n * (1..n))` (8 heads: `2^-1 ... 2^-8`). Otherwise, as the
    paper's reference code: the slopes of the largest power of two `p < n`, then every other
    slope of `2p` heads (`2^(-8/(2p) * (1, 3, 5, ...))`) for the remaining `n - p` heads.
    """
    if math.log2(num_heads).is_integer():
        return [2.0 ** (-8.0 / num_heads * head) for head in range(1, num_heads + 1)]
    power = 2 ** math.floor(math.log2(num_heads))
    return alibi_slopes(power) + alibi_slopes(2 * power)[0::2][: num_heads - power]


@keras.saving.register_keras_serializable(package="keras_attn")
class ALiBi(PositionBias):
    """ALiBi (Press et al., 2022): head `h` adds `-slope_h * |i - j|` to the logit of query `i`, key `j`.

    No position embeddings and no weights: each head penalises distance linearly with its own
    slope (`alibi_slopes`: `2^-1 ... 2^-8` for 8 heads), which lets a model trained on short
    sequences attend over longer ones. Under a causal mask (`j <= i`) this is the paper's
    `m * (j - i)`; without one the penalty is symmetric in the distance. The bias is computed
    per block from positions in float32 by every kernel (`keras_attn.core.position_bias`), never as a
    `(heads, L, L)` tensor on the chunked and blockwise paths.

    Args:
        num_heads: number of attention heads.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments and return value: as `keras_attn.core.position_bias.PositionBias` (positions in,
    the bias `(batch or 1, heads, query_len, key_len)` out).

    Example:

    >>> alibi = ALiBi(num_heads=8)
    >>> bias = alibi(keras.ops.arange(4), keras.ops.arange(4))
    >>> tuple(bias.shape), float(bias[0, 0, 3, 1])  # head 0: slope 1/2, distance 2
    ((1, 8, 4, 4), -1.0)

    Give it to `keras_attn.MultiHeadAttention(num_heads=8, key_dim=16, position_bias=alibi)`,
    to the blocks, or to `scaled_dot_product_attention(..., position_bias=alibi)`.
    """

    def block_bias(self, parameters, query_positions, key_positions):
        dtype = self.bias_dtype
        distance = ops.cast(ops.abs(relative_positions(query_positions, key_positions)), dtype)  # (batch | 1, q, k)
        slopes = ops.convert_to_tensor(np.asarray(alibi_slopes(self.num_heads)), dtype)  # (heads,)
        return -ops.reshape(slopes, (1, -1, 1, 1)) * ops.expand_dims(distance, 1)  # (batch | 1, heads, q, k)
