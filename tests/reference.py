"""NumPy float64 reference implementations: the independent oracle the tests compare against.

Nothing here imports keras_attn. Layouts follow keras_attn: `(batch, seq, heads, depth)` for
query/key/value, `(batch, heads, query_len, key_len)` for masks, biases and weights.
"""

import numpy as np


def attention(query, key, value, mask=None, bias=None, is_causal=False, sliding_window=None, scale=None, soft_cap=None):
    """Float64 scaled dot-product attention; returns `(output, weights)`.

    Fully masked query rows get zero weights and zero output (the keras_attn contract). With a
    `soft_cap` the scaled logits are `tanh(logits / cap) * cap` before the bias is added (Gemma 2).
    """
    logits, allowed, value = _allowed_logits(query, key, value, mask, bias, is_causal, sliding_window, scale, soft_cap)
    row_max = np.max(logits, axis=-1, keepdims=True, initial=-np.inf)  # no keys: -inf, read as 0
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exp = np.where(allowed, np.exp(logits - row_max), 0.0)
    total = exp.sum(axis=-1, keepdims=True)
    weights = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    output = np.einsum("bhqk,bkhd->bqhd", weights, value)
    return output, weights


def _allowed_logits(query, key, value, mask, bias, is_causal, sliding_window, scale, soft_cap=None):
    """Float64 logits `(batch, heads, query_len, key_len)` with `-inf` where not allowed, the
    boolean allowed matrix, and the value with its heads repeated to the query heads."""
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    groups = query.shape[2] // key.shape[2]
    key = np.repeat(key, groups, axis=2)
    value = np.repeat(value, groups, axis=2)
    if scale is None:
        scale = 1.0 / np.sqrt(query.shape[-1])
    logits = np.einsum("bqhd,bkhd->bhqk", query, key) * scale
    if soft_cap is not None:
        logits = np.tanh(logits / soft_cap) * soft_cap
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    query_len, key_len = query.shape[1], key.shape[1]
    allowed = np.ones((1, 1, query_len, key_len), bool)
    rows, cols = np.arange(query_len)[:, None], np.arange(key_len)[None, :]
    if is_causal:
        allowed = allowed & (cols <= rows)
    if sliding_window is not None:
        allowed = allowed & (np.abs(rows - cols) < sliding_window)
    if mask is not None:
        allowed = allowed & np.asarray(mask, bool)
    allowed = np.broadcast_to(allowed, logits.shape)
    return np.where(allowed, logits, -np.inf), allowed, value


def hard_attention(query, key, value, mask=None, bias=None, is_causal=False, scale=None):
    """Float64 hard attention from its definition; returns `(output, one_hot_weights)`.

    Each query row's weight is 1 on its allowed key with the largest logit (ties: the lowest
    index) and 0 elsewhere; a row without allowed keys has zero weights, hence a zero output.
    """
    logits, allowed, value = _allowed_logits(query, key, value, mask, bias, is_causal, None, scale)
    chosen = np.argmax(logits, axis=-1)  # NumPy's argmax returns the first maximum
    weights = (np.arange(logits.shape[-1]) == chosen[..., None]) & allowed.any(axis=-1, keepdims=True)
    weights = weights.astype(np.float64)
    return np.einsum("bhqk,bkhd->bqhd", weights, value), weights


def hard_attention_gradients(query, key, value, output_gradient, mask=None, bias=None, is_causal=False, scale=None):
    """Float64 straight-through gradients of `hard_attention` for the output gradient `dO`.

    The definition keras_attn uses: with `H` the one-hot weights and `P` the soft weights of
    `attention` at the same scale, `dV = H^T dO`, `dW = dO V^T`, the logits' gradient
    `dL = P * (dW - rowsum(P * dW))` (the softmax's), `dQ = scale dL K`, `dK = scale dL^T Q` and
    `dbias = dL` (summed over the bias's broadcast axes). One head per key/value head.

    Returns:
        `(d_query, d_key, d_value, d_bias)`; `d_bias` is `None` without a bias.
    """
    query, key, value, output_gradient = (np.asarray(t, np.float64) for t in (query, key, value, output_gradient))
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    _, soft = attention(query, key, value, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    _, hard = hard_attention(query, key, value, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    d_value = np.einsum("bhqk,bqhd->bkhd", hard, output_gradient)
    d_weights = np.einsum("bqhd,bkhd->bhqk", output_gradient, value)
    d_logits = soft * (d_weights - np.sum(soft * d_weights, axis=-1, keepdims=True))
    d_query = scale * np.einsum("bhqk,bkhd->bqhd", d_logits, key)
    d_key = scale * np.einsum("bhqk,bqhd->bkhd", d_logits, query)
    d_bias = None
    if bias is not None:
        broadcast = tuple(axis for axis, size in enumerate(np.shape(bias)) if size == 1)
        d_bias = np.sum(d_logits, axis=broadcast, keepdims=True)
    return d_query, d_key, d_value, d_bias


def attention_gradients(
    query, key, value, output_gradient, mask=None, bias=None, is_causal=False, scale=None, soft_cap=None
):
    """Float64 gradients `(d_query, d_key, d_value, d_bias)` of `sum(attention(...)[0] * output_gradient)`.

    Written out from `O = P V`, `P = softmax(S)`, `S = scale Q K^T + bias` (one key/value head
    per query head): `dS = P * (dO V^T - rowsum(dO * O))`; a row without keys has `P = 0`, so
    every gradient through it is 0, as is the bias gradient at a masked or `-inf` entry. With a
    `soft_cap`, `S = cap * tanh(scale Q K^T / cap) + bias`: the query and key get `dS` times the
    derivative of the cap, `1 - tanh(scale Q K^T / cap)^2`, the bias `dS` itself.
    """
    query, key, value, output_gradient = (np.asarray(t, np.float64) for t in (query, key, value, output_gradient))
    if scale is None:
        scale = 1.0 / np.sqrt(query.shape[-1])
    output, weights = attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal, scale=scale, soft_cap=soft_cap
    )
    d_weights = np.einsum("bqhd,bkhd->bhqk", output_gradient, value)  # (batch, heads, query_len, key_len)
    delta = np.einsum("bqhd,bqhd->bhq", output_gradient, output)[..., None]  # (batch, heads, query_len, 1)
    d_logits = weights * (d_weights - delta)
    d_raw = d_logits
    if soft_cap is not None:
        d_raw = d_logits * (1.0 - np.tanh(np.einsum("bqhd,bkhd->bhqk", query, key) * scale / soft_cap) ** 2)
    d_query = scale * np.einsum("bhqk,bkhd->bqhd", d_raw, key)
    d_key = scale * np.einsum("bhqk,bqhd->bkhd", d_raw, query)
    d_value = np.einsum("bhqk,bqhd->bkhd", weights, output_gradient)
    return d_query, d_key, d_value, d_logits


def multi_head_attention(weights, query, value, key=None, mask=None, bias=None, is_causal=False, sliding_window=None):
    """Float64 multi-head attention from a keras_attn / Keras `MultiHeadAttention`'s weights.

    Args:
        weights: `layer.get_weights()` in Keras order: query kernel, bias, key kernel, bias,
            value kernel, bias, output kernel, bias (with `use_bias=True`).
        mask: boolean mask broadcastable to `(batch, heads, query_len, key_len)`; a query row it
            leaves without any key in every head (a padded query) outputs zero, bias included.
    """
    key = value if key is None else key
    wq, bq, wk, bk, wv, bv, wo, bo = (np.asarray(w, np.float64) for w in weights)
    q = np.einsum("btf,fhd->bthd", query, wq) + bq
    k = np.einsum("btf,fhd->bthd", key, wk) + bk
    v = np.einsum("btf,fhd->bthd", value, wv) + bv
    attended, attention_weights = attention(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal, sliding_window=sliding_window
    )
    output = np.einsum("bthd,hdo->bto", attended, wo) + bo
    if mask is not None:
        rows = np.broadcast_to(mask, attention_weights.shape).any(axis=(1, 3))  # (batch, query_len)
        output = np.where(rows[..., None], output, 0.0)
    return output, attention_weights


def pattern_allowed(spec, rows, cols):
    """Boolean `(len(rows), len(cols))` of an attention pattern from its definition, positions as given.

    `spec` is `("causal",)`, `("window", w)`, `("strided", s)`, `("block", b)`, `("global", n)`,
    `("and", a, b)` or `("or", a, b)`.
    """
    rows, cols = np.asarray(rows)[:, None], np.asarray(cols)[None, :]
    kind = spec[0]
    if kind == "causal":
        return np.broadcast_to(cols <= rows, (rows.shape[0], cols.shape[1]))
    if kind == "window":
        return np.abs(rows - cols) < spec[1]
    if kind == "strided":
        return (rows - cols) % spec[1] == 0
    if kind == "block":
        return rows // spec[1] == cols // spec[1]
    if kind == "global":
        return (rows < spec[1]) | (cols < spec[1])
    left, right = pattern_allowed(spec[1], rows[:, 0], cols[0]), pattern_allowed(spec[2], rows[:, 0], cols[0])
    return left & right if kind == "and" else left | right


def log_softmax(logits):
    """Float64 log-softmax over the last axis."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def layer_norm(x, gamma, beta, epsilon):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def sinusoidal_encoding(length, dim, max_wavelength=10000.0):
    """Vaswani et al. (2017): `sin` on even features, `cos` on odd ones; `(length, dim)`."""
    positions = np.arange(length, dtype=np.float64)[:, None]
    pair = np.arange(dim)[None, :] // 2
    angles = positions / np.power(max_wavelength, 2.0 * pair / dim)
    return np.where(np.arange(dim)[None, :] % 2 == 0, np.sin(angles), np.cos(angles))


def rotary_embedding(x, start_index=0, max_wavelength=10000.0, scaling_factor=1.0):
    """Float64 RoPE, "rotate half" pairing: feature `i` with feature `i + depth / 2`.

    `x` is `(batch, seq, heads, depth)`; each pair is the complex number `x_i + 1j * x_{i+d/2}`
    multiplied by `exp(1j * angle)`, `angle = (t / scaling_factor) / max_wavelength ** (2i / d)`.
    """
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    positions = (start_index + np.arange(x.shape[1], dtype=np.float64)) / scaling_factor
    angles = positions[:, None] / np.power(max_wavelength, 2.0 * np.arange(half) / x.shape[-1])
    pairs = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * angles)[None, :, None, :]
    return np.concatenate([pairs.real, pairs.imag], axis=-1)


def feed_forward(x, w1, b1, w2, b2):
    """Float64 ReLU feed-forward block `relu(x W1 + b1) W2 + b2`."""
    hidden = np.maximum(np.asarray(x, np.float64) @ w1 + b1, 0.0)
    return hidden @ w2 + b2


def residual_block(x, sublayer, gamma, beta, epsilon, norm_first):
    """`norm(x + f(x))` (post-norm) or `x + f(norm(x))` (pre-norm)."""
    if norm_first:
        return x + sublayer(layer_norm(x, gamma, beta, epsilon))
    return layer_norm(x + sublayer(x), gamma, beta, epsilon)


def without_padding(x, padding):
    """Float64 `x` `(batch, seq, features)` with zero rows where the boolean `padding` `(batch, seq)` is `False`."""
    x = np.asarray(x, np.float64)
    return x if padding is None else np.where(np.asarray(padding, bool)[..., None], x, 0.0)


def transformer_encoder(
    weights, x, mask=None, norm_first=False, epsilon=1e-5, sliding_window=None, bias=None, padding=None
):
    """Float64 Transformer encoder block from a `TransformerEncoder`'s `get_weights()`.

    Weight order: self-attention (8, as `multi_head_attention`), its layer norm (gamma, beta),
    feed-forward (W1, b1, W2, b2), its layer norm. `mask` and the self-attention `bias`
    broadcast to `(batch, heads, seq, seq)`; the block reads the rows `padding` `(batch, seq)`
    marks `False` as zeros.
    """
    attention, norm1, ffn, norm2 = weights[:8], weights[8:10], weights[10:14], weights[14:16]
    x = without_padding(x, padding)
    x = residual_block(
        x,
        lambda h: multi_head_attention(attention, h, h, mask=mask, bias=bias, sliding_window=sliding_window)[0],
        *norm1,
        epsilon,
        norm_first,
    )
    return residual_block(x, lambda h: feed_forward(h, *ffn), *norm2, epsilon, norm_first)


def transformer_decoder(
    weights,
    x,
    encoder=None,
    self_mask=None,
    cross_mask=None,
    norm_first=False,
    epsilon=1e-5,
    is_causal=True,
    self_bias=None,
    padding=None,
):
    """Float64 Transformer decoder block from a `TransformerDecoder`'s `get_weights()`.

    Weight order: self-attention (8), its layer norm (2), [cross-attention (8), its layer norm
    (2) when `encoder` is given], feed-forward (4), its layer norm (2). `self_bias` is added to
    the self-attention logits, broadcast to `(batch, heads, seq, seq)`; the block reads the rows
    of `x` that `padding` `(batch, seq)` marks `False` as zeros.
    """
    x = without_padding(x, padding)
    self_attention, norm1, rest = weights[:8], weights[8:10], weights[10:]
    x = residual_block(
        x,
        lambda h: multi_head_attention(self_attention, h, h, mask=self_mask, bias=self_bias, is_causal=is_causal)[0],
        *norm1,
        epsilon,
        norm_first,
    )
    if encoder is not None:
        cross_attention, norm2, rest = rest[:8], rest[8:10], rest[10:]
        encoder = np.asarray(encoder, np.float64)
        x = residual_block(
            x,
            lambda h: multi_head_attention(cross_attention, h, encoder, mask=cross_mask)[0],
            *norm2,
            epsilon,
            norm_first,
        )
    ffn, norm3 = rest[:4], rest[4:6]
    return residual_block(x, lambda h: feed_forward(h, *ffn), *norm3, epsilon, norm_first)


def padding_attention_mask(query_padding=None, key_padding=None):
    """`(batch, 1, query_len, key_len)` mask from `(batch, len)` padding masks (`None` = all real)."""
    rows = None if query_padding is None else np.asarray(query_padding, bool)[:, None, :, None]
    cols = None if key_padding is None else np.asarray(key_padding, bool)[:, None, None, :]
    if rows is None:
        return cols
    return rows if cols is None else rows & cols


def project_heads(x, kernel, bias=None):
    """Float64 `(batch, seq, features) x (features, heads, depth) -> (batch, seq, heads, depth)`."""
    heads = np.einsum("btf,fhd->bthd", np.asarray(x, np.float64), np.asarray(kernel, np.float64))
    return heads if bias is None else heads + np.asarray(bias, np.float64)


def merge_heads(x, kernel, bias=None, rows=None):
    """Float64 output projection `(batch, seq, heads, depth) x (heads, depth, out) -> (batch, seq, out)`;
    zero (bias included) where the boolean `rows` `(batch, seq)` is `False` (padded queries)."""
    merged = np.einsum("bthd,hdo->bto", np.asarray(x, np.float64), np.asarray(kernel, np.float64))
    merged = merged if bias is None else merged + np.asarray(bias, np.float64)
    return merged if rows is None else np.where(np.asarray(rows, bool)[..., None], merged, 0.0)


def elu_plus_one(x):
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def favor_features(x, projection):
    """Float64 FAVOR+ features `exp(W x - |x|^2 / 2) / sqrt(m)` of pre-scaled `x`, unstabilised."""
    x, projection = np.asarray(x, np.float64), np.asarray(projection, np.float64)
    log_features = np.einsum("...d,md->...m", x, projection) - 0.5 * np.sum(x * x, -1, keepdims=True)
    return np.exp(log_features) / np.sqrt(projection.shape[0])


def linear_attention_recurrence(query_features, key_features, value, mask=None, is_causal=False):
    """Float64 linear attention, one token at a time (the RNN form when causal).

    Inputs `(batch, seq, heads, features | value_dim)`; `mask` `(batch, seq)` removes keys and
    zeroes queries. A query with no key outputs zeros.
    """
    query_features, key_features, value = (np.asarray(t, np.float64) for t in (query_features, key_features, value))
    batch, length, heads, _ = value.shape
    keep = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    output = np.zeros_like(value)
    for b in range(batch):
        for h in range(heads):
            summary = np.zeros((query_features.shape[-1], value.shape[-1]))
            normaliser = np.zeros(query_features.shape[-1])
            if not is_causal:
                for j in range(length):
                    if keep[b, j]:
                        summary += np.outer(key_features[b, j, h], value[b, j, h])
                        normaliser += key_features[b, j, h]
            for i in range(length):
                if is_causal and keep[b, i]:
                    summary += np.outer(key_features[b, i, h], value[b, i, h])
                    normaliser += key_features[b, i, h]
                denominator = query_features[b, i, h] @ normaliser
                if keep[b, i] and denominator > 0:
                    output[b, i, h] = query_features[b, i, h] @ summary / denominator
    return output


def linear_attention_weights(query_features, key_features, mask=None, is_causal=False):
    """Float64 weights linear attention implies, `(batch, heads, seq, seq)`, pair by pair:
    `phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')` over the allowed keys (`mask` removes keys
    and zeroes queries; causal, `j <= i`); a query with no key gets zeros."""
    query_features, key_features = np.asarray(query_features, np.float64), np.asarray(key_features, np.float64)
    batch, length, heads, _ = query_features.shape
    keep = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    weights = np.zeros((batch, heads, length, length))
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                keys = [j for j in range(length) if keep[b, j] and keep[b, i] and (not is_causal or j <= i)]
                scores = np.array([query_features[b, i, h] @ key_features[b, j, h] for j in keys])
                if keys and scores.sum() > 0:
                    weights[b, h, i, keys] = scores / scores.sum()
    return weights


def lsh_attention(
    query, value, rotations, num_buckets, chunk_size, mask=None, is_causal=False, self_logit=-1e5, return_weights=False
):
    """Float64 Reformer attention, query by query: each round's window in the (bucket, position) order.

    `query` `(batch, seq, heads, depth)` (keys are its unit-length rows), `value` `(batch, seq,
    heads, value_dim)`, `rotations` `(heads, depth, hashes, num_buckets // 2)`. Padding is
    never attended and gets zero output; causal, a token attends to the `chunk_size` latest
    tokens of its bucket up to itself; a token's own key has logit `self_logit`; the rounds are
    weighted by the softmax of their log-sum-exps. With `return_weights`, also the weights
    `(batch, heads, seq, seq)` the output is made of: each round's probabilities at their keys,
    times the round's share (a key two rounds find gets both), zero elsewhere.
    """
    query, value = np.asarray(query, np.float64), np.asarray(value, np.float64)
    batch, length, heads, depth = query.shape
    valid = np.ones((batch, length), bool) if mask is None else np.asarray(mask, bool)
    key = query / np.maximum(np.linalg.norm(query, axis=-1, keepdims=True), 1e-6)
    output = np.zeros(value.shape)
    weights = np.zeros((batch, heads, length, length))
    for b in range(batch):
        for h in range(heads):
            rotated = np.einsum("td,drk->rtk", key[b, :, h], np.asarray(rotations, np.float64)[h])
            rounds = []
            for r in range(rotated.shape[0]):
                buckets = (
                    np.zeros(length, int)
                    if num_buckets == 1
                    else np.argmax(np.concatenate([rotated[r], -rotated[r]], -1), -1)
                )
                buckets = np.where(valid[b], buckets, num_buckets)
                order = sorted(range(length), key=lambda t: (buckets[t], t))
                rank = {t: i for i, t in enumerate(order)}
                for i in range(length):
                    chunk = rank[i] // chunk_size
                    window = order[max(chunk - 1, 0) * chunk_size : (chunk + 1) * chunk_size]
                    keys = [j for j in window if valid[b, j] and valid[b, i]]
                    if is_causal:  # the chunk_size latest tokens of its own bucket, itself included
                        keys = [j for j in range(i + 1) if valid[b, j] and valid[b, i] and buckets[j] == buckets[i]]
                        keys = keys[-chunk_size:]
                    if not keys:
                        rounds.append((r, i, -np.inf, np.zeros(value.shape[-1]), np.zeros(length)))
                        continue
                    logits = np.array(
                        [self_logit if j == i else query[b, i, h] @ key[b, j, h] / np.sqrt(depth) for j in keys]
                    )
                    top = logits.max()
                    lse = top + np.log(np.exp(logits - top).sum())
                    probabilities = np.zeros(length)
                    probabilities[keys] = np.exp(logits - lse)
                    rounds.append((r, i, lse, probabilities @ value[b, :, h], probabilities))
            for i in range(length):
                per_round = [(lse, out, p) for _, q, lse, out, p in rounds if q == i]
                lses = np.array([lse for lse, _, _ in per_round])
                if np.all(np.isneginf(lses)):
                    continue
                shares = np.exp(lses - lses.max())
                shares /= shares.sum()
                output[b, i, h] = sum(s * out for s, (_, out, _) in zip(shares, per_round))
                weights[b, h, i] = sum(s * p for s, (_, _, p) in zip(shares, per_round))
    return (output, weights) if return_weights else output


def alibi_slopes(num_heads):
    """ALiBi's head slopes, transcribed from the paper's reference code (Press et al., 2022)."""

    def power_of_two_slopes(n):
        start = 2 ** (-(2 ** -(np.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if np.log2(num_heads).is_integer():
        return power_of_two_slopes(num_heads)
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    return power_of_two_slopes(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_bias(num_heads, query_positions, key_positions):
    """Float64 ALiBi bias `(1, heads, q, k)`: `-slope_h * |i - j|`."""
    distance = np.abs(np.asarray(query_positions)[:, None] - np.asarray(key_positions)[None, :])
    return -np.asarray(alibi_slopes(num_heads))[None, :, None, None] * distance[None, None]


def t5_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's `_relative_position_bucket` (mesh_tensorflow transformer), transcribed to NumPy.

    `relative_position = memory_position - query_position`; float32 logarithm as in T5.
    """
    ret = 0
    n = -np.asarray(relative_position, np.int64)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        val_if_large = max_exact + (
            np.log(n.astype(np.float32) / max_exact)
            / np.float32(np.log(max_distance / max_exact))
            * (num_buckets - max_exact)
        )
    val_if_large = np.minimum(np.where(is_small, 0, val_if_large).astype(np.int64), num_buckets - 1)
    return ret + np.where(is_small, n, val_if_large)


def relative_position_bias(table, query_positions, key_positions, bidirectional=True, max_distance=128):
    """Float64 T5 bias `(1, heads, q, k)` from a `(num_buckets, heads)` table."""
    table = np.asarray(table, np.float64)
    relative = np.asarray(key_positions)[None, :] - np.asarray(query_positions)[:, None]
    buckets = t5_relative_position_bucket(relative, bidirectional, table.shape[0], max_distance)
    return np.transpose(table[buckets], (2, 0, 1))[None]
