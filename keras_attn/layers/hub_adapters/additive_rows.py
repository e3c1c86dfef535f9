"""The rows an additive `-1e9` mask hides entirely, as KerasHub's own softmax computes them.

T5's and T5Gemma's attention add their mask to the logits as `-1e9` and softmax the sum. A query
whose keys the mask all hides (a left-padded decoder's first positions) has logits that float32
rounds to the mask's values (the logits themselves are rounded away): the softmax of those values,
and, the mask being added, a gradient that reaches the query, the keys and the bias through them.
Where the mask is one `-1e9`, that is the mean of the values; where it adds several (T5Gemma 2's
encoder adds its sliding window's `-1e9` to the padding's), the keys the window also hides sit at
`-2e9` and get no weight: the mean of the values of the keys at the row's highest level.
`keras_attn.scaled_dot_product_attention` reads such a bias as a mask and gives the row zero;
`with_additive_rows` puts KerasHub's row in its place.
"""

from keras import ops

from keras_attn.core.softmax import bias_mask
from keras_attn.core.softmax import softmax


def with_additive_rows(output, query, key, value, bias, scale, soft_cap=None):
    """`output` `(batch, query_len, heads, head_dim)` with the rows whose keys `bias` all masks as
    KerasHub computes them: the float32 softmax of `soft_cap(scale * Q K^T) + bias`, its forward and
    its gradient. Computed densely (the bias is dense already) and only when such a row exists;
    `query`, `key`, `value` have the same heads."""
    has_keys = ops.transpose(ops.any(bias_mask(bias), axis=-1), (0, 2, 1))[..., None]  # (batch | 1, q, heads | 1, 1)

    def hub_rows():
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key) * ops.cast(scale, query.dtype)
        if soft_cap is not None:
            logits = ops.tanh(logits / soft_cap) * soft_cap
        weights = softmax(ops.cast(logits, "float32") + ops.cast(bias, "float32"))
        rows = ops.einsum("bhqk,bkhd->bqhd", weights, ops.cast(value, weights.dtype))
        return ops.where(has_keys, output, ops.cast(rows, output.dtype))

    return ops.cond(ops.all(has_keys), lambda: output, hub_rows)
