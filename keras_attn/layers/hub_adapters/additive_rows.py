"""The rows an additive `-1e9` mask hides entirely, as KerasHub's own softmax computes them.

T5's and T5Gemma's attention add their mask to the logits as `-1e9` and softmax the sum. A query
whose keys the mask all hides (a left-padded decoder's first positions) has equal logits once the
`-1e9` is added (float32 rounds the rest away): uniform weights, the mean of the values, and, the
mask being added, a gradient that reaches the query, the keys and the bias through those logits.
`keras_attn.scaled_dot_product_attention` reads such a bias as a mask and gives the row zero;
`with_additive_rows` puts KerasHub's row in its place.
"""

from keras import ops

from keras_attn.core.softmax import bias_mask


def with_additive_rows(output, query, key, value, bias, scale, soft_cap=None):
    """`output` `(batch, query_len, heads, head_dim)` with the rows whose keys `bias` all masks as
    KerasHub computes them: the softmax of `soft_cap(scale * Q K^T) + bias` at equal values (its
    forward uniform, its gradient the softmax's at those logits). Computed densely (the bias is
    dense already) and only when such a row exists; `query`, `key`, `value` have the same heads."""
    has_keys = ops.transpose(ops.any(bias_mask(bias), axis=-1), (0, 2, 1))[..., None]  # (batch | 1, q, heads | 1, 1)

    def hub_rows():
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key) * ops.cast(scale, query.dtype)
        if soft_cap is not None:
            logits = ops.tanh(logits / soft_cap) * soft_cap
        logits = logits + ops.cast(bias, logits.dtype)
        weights = ops.softmax(logits - ops.stop_gradient(logits), axis=-1)  # uniform, the gradient at `logits`
        rows = ops.einsum("bhqk,bkhd->bqhd", weights, ops.cast(value, weights.dtype))
        return ops.where(has_keys, output, ops.cast(rows, output.dtype))

    return ops.cond(ops.all(has_keys), lambda: output, hub_rows)
