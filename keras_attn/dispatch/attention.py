"""Scaled dot-product attention: the dispatcher of the one attention core every layer plugs into.

Every attention family in keras_attn reaches the softmax through this module. A family contributes
a boolean mask (padding, causal, band, strided, ...), an additive bias, a position bias computed
per block from positions (`keras_attn.core.position_bias`: ALiBi, T5's relative positions), or several;
this module validates the call, turns the shorthands into one `keras_attn.patterns`
pattern, resolves the scale, and hands an `AttentionCall` to a kernel of the registry
(`keras_attn.kernels.KERNELS`: dense, chunked, blockwise, strided), each of which says itself which
calls it takes (`why_unsupported`). The numerics every kernel shares live in `keras_attn.core.softmax`:

- logits and softmax in float32 whatever the compute dtype;
- a masked key's weight is exactly 0 at any scale of the logits: the dense path fills its logit
  with the dtype's lowest finite value (`keras_attn.core.softmax.mask_fill`, finite so that
  tf2onnx's arithmetic `where` never computes `0 * inf`), the streaming kernels exclude it with
  `-inf` (`keras_attn.kernels.streaming_softmax.exclude`) and read a row's `-inf` statistics as 0;
- a query row whose keys are all masked gets all-zero weights and a zero output, on every path;
- a logit soft cap (`logit_soft_cap`, `keras_attn.core.softmax.soft_capped`) applies to
  `scale * Q K^T` before the bias, position bias and mask, on every kernel;
- attention dropout is applied to the normalised weights.

Layout: `(batch, seq, heads, depth)` for query, key and value (what the projections of
`MultiHeadAttention` produce, no transposes needed); masks and biases broadcast to
`(batch, heads, query_len, key_len)`.
"""

from keras import ops

from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import zero_masked
from keras_attn.core.masks import zero_padding
from keras_attn.core.position_bias import check_position_bias
from keras_attn.core.segments import resolve_segment_ids
from keras_attn.core.softmax import bias_mask
from keras_attn.core.softmax import resolved_scale
from keras_attn.dispatch import cost_model
from keras_attn.dispatch.arguments import checked_pattern
from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall
from keras_attn.validation import check_bool

ATTENTION_IMPLEMENTATIONS = ("auto", *KERNELS)


def _zero_unattended_keys(key, value, mask):
    """Keys and values that no query may attend to (padding) set to 0: whatever they hold, NaN
    and inf included, cannot reach a real output through `0 * NaN` in the logits or the value
    product of any kernel."""
    attended = ops.any(mask, axis=(1, 2))  # (batch | 1, key_len)
    attended = ops.expand_dims(ops.expand_dims(attended, -1), -1)  # (batch | 1, key_len, 1, 1)
    return zero_masked(key, attended), zero_masked(value, attended)


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
    hard=False,
    position_bias=None,
    segment_ids=None,
    query_segment_ids=None,
    key_segment_ids=None,
    logit_soft_cap=None,
    zero_unattended_keys=True,
):
    """Scaled dot-product attention, `softmax(scale * Q K^T + bias) V`, with exact masking.

    `scale` is the inverse temperature beta of `softmax_beta(x) = softmax(beta * x)`: the larger,
    the closer the weights come to one-hot on each row's largest logit, which `hard=True` takes
    exactly (hard attention: the output is the value of the argmax key).

    Args:
        query: `(batch, query_len, heads, depth)`.
        key: `(batch, key_len, kv_heads, depth)`; `heads` must be a multiple of `kv_heads`
            (grouped-query attention; `kv_heads=1` is multi-query attention).
        value: `(batch, key_len, kv_heads, value_depth)`.
        mask: optional boolean tensor broadcastable to `(batch, heads, query_len, key_len)`,
            `True` where a query may attend to a key.
        bias: optional additive float bias broadcastable to
            `(batch, heads, query_len, key_len)`, added to the logits in float32. An entry at or
            below `keras_attn.core.softmax.MASKING_BIAS` (`-inf`, the dtype's lowest value, `-1e9`)
            masks its key exactly like `mask=False` (zero weight, finite gradients).
        is_causal: if `True`, query `i` attends only to keys `j <= i` (top-left aligned);
            shorthand for `pattern=keras_attn.patterns.Causal()`.
        sliding_window: optional positive int; query `i` attends only to keys with
            `|i - j| < sliding_window`; shorthand for `pattern=SlidingWindow(sliding_window)`.
        query_offset: position (>= 0) of the first query among the keys (an int or a scalar int
            tensor) for the pattern; non-zero in cached decoding, where the queries are the
            newest tokens of a longer key/value cache.
        scale: the inverse temperature beta multiplying `Q K^T` (a positive number or a
            scalar tensor, at most the largest float32: the logits are float32); defaults to
            `1 / sqrt(depth)`. The bias is added after it.
        dropout_rate: dropout applied to the attention weights when `training`.
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for dropout (one is made if `None`).
        return_weights: if `True`, also return the attention weights (normalised, before
            dropout, as `keras.layers.MultiHeadAttention` returns its scores).
        implementation: `"dense"` materialises the `(query_len, key_len)` weights (the
            reference); `"chunked"` (TensorFlow backend; static lengths, an int
            `query_offset`, and a mask/bias with static query and key dimensions) uses
            `keras_attn.kernels.chunked`: queries in chunks of
            `keras_attn.kernels.chunked.QUERY_CHUNK_SIZE`, each over
            only the keys the pattern lets it reach (about half the work of `"dense"` under a
            causal mask; every key without a pattern), with a written-out gradient, same numerics;
            `"blockwise"` (TensorFlow backend) uses
            `keras_attn.kernels.blockwise`, memory linear in the length, skipping the key
            blocks the pattern excludes, same numerics;
            `"strided"` (TensorFlow backend; a pattern with a strided part, e.g.
            `Causal() & (SlidingWindow(s) | Strided(s))`, static lengths, an int `query_offset`,
            no bias, no dropout) uses `keras_attn.kernels.strided`: each query computes only
            a band of keys and its residue class `(i - j) % s == 0`, memory linear in the length;
            `"auto"` (`keras_attn.dispatch.cost_model`) considers the kernels that take the call,
            predicted to hold at most the peak memory of Keras's dense attention for the same call
            (its logits, weights and dropout in the compute dtype), unrolling at most 512 steps
            into the graph (the chunked kernel on packed rows of thousands of tokens unrolls more)
            and predicted within 3x of the fastest of them; it takes the fastest measured on this
            machine, or the lightest of those measured within 10 % of it; when no kernel qualifies,
            the one predicted lightest. Each bucket of call signatures (lengths rounded down to a
            power of two) is measured once, at the shapes of its first call, in the call's mode
            (forward and backward when `training`), outside the graph being traced, and kept in the user's cache directory (`$KERAS_ATTN_CACHE`, else
            `~/.cache/keras_attn`); with measuring off (`KERAS_ATTN_MEASURE=0` or
            `keras_attn.set_measured_dispatch(False)`) the predicted times decide. Predictions come
            from a calibration fitted to measurements (shipped, or refitted on this machine by
            `keras_attn.tune()`); with an unknown length, the dense kernel.
            `keras_attn.explain_implementation` shows each kernel's times and why it was or was
            not taken.
        pattern: optional `keras_attn.patterns.Pattern` (or its config): which keys each
            query position may attend to; intersected with `is_causal` and `sliding_window`.
        hard: if `True`, hard attention: each query's weights are one-hot on its allowed key
            with the largest logit `scale * q.k + bias` (ties: the lowest key index), so the
            output is that key's value; a row without allowed keys gets zero weights and a zero
            output. Gradients are straight-through: the logits (query, key, bias) get the
            gradient of the soft weights `softmax(scale * Q K^T + bias)` at the same scale as if
            they had been used, the value gets the gradient through the one-hot weights (only the
            selected keys' values receive `dO`). Returned weights are the one-hot ones. Dense
            kernel only: `"auto"` picks it, `"chunked"` / `"blockwise"` raise a `ValueError`.
        position_bias: optional `keras_attn.core.position_bias.PositionBias` layer for the query
            heads (`keras_attn.ALiBi`, `keras_attn.RelativePositionBias`): its bias of query
            position `query_offset + i` and key position `j` is added to the logits in float32,
            computed per chunk or block from positions on the chunked and blockwise paths
            (never a `(batch, heads, query_len, key_len)` tensor there), with gradients to its
            weights on every path.
        segment_ids: optional int `(batch, length)` document ids of a packed row, `0` for padding
            (self-attention: queries and keys are the same tokens): a query attends only to keys of
            its own document, intersected with the mask and the pattern (`is_causal=True` is then
            causal within each document); a padding query outputs zeros. The blockwise and chunked
            kernels skip the blocks in which no query shares a document with a key
            (`keras_attn.kernels.document_blocks`); the strided kernel skips only padding.
        query_segment_ids: optional int `(batch, query_len)` document ids of the queries, with
            `key_segment_ids` `(batch, key_len)`: cross-attention and cached decoding (the queries'
            ids beside the whole cache's). A `position_bias` stays one of row positions (query
            `query_offset + i`, key `j`): right for cached decoding, where each document runs on
            in the cache's row, not for packed cross-attention rows whose documents start at
            different places in the two rows (give those no position bias).
        key_segment_ids: see `query_segment_ids`.
        logit_soft_cap: optional number `cap`, a normal float32 (`[1.18e-38, 3.4e38]`): the logits become
            `tanh(scale * Q K^T / cap) * cap` before the bias, the position bias and the mask are
            added (Gemma 2 and Gemma 3's `attention_logit_soft_cap`, FlashAttention's `softcap`), on
            every kernel, with its gradient.
        zero_unattended_keys: if `True` (default), the keys and values that no query may attend to
            (all `False` in `mask`, a masking `bias` included) are set to zero by selection first,
            so whatever they hold (NaN, inf) reaches no output and no gradient. `False` skips those
            two selects, a pass over all the keys and values (in a cached decoding step, over the
            whole cache) on every call, for callers whose masked keys and values are finite or that
            keep Keras's semantics (Keras's attention computes with them as they are): the
            converted KerasHub layers (`keras_attn.layers.hub_adapters`).

    Returns:
        The output `(batch, query_len, heads, value_depth)` in the dtype of `value`, and, when
        `return_weights`, the weights `(batch, heads, query_len, key_len)` in the same dtype.
        A query row whose keys are all masked has all-zero weights and a zero output.

    Example:

    >>> import keras
    >>> q = k = v = keras.random.normal((2, 5, 4, 8))
    >>> out, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    >>> tuple(out.shape), tuple(w.shape)
    ((2, 5, 4, 8), (2, 4, 5, 5))
    """
    pattern = checked_pattern(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        sliding_window=sliding_window,
        query_offset=query_offset,
        scale=scale,
        dropout_rate=dropout_rate,
        training=training,
        return_weights=return_weights,
        pattern=pattern,
        hard=hard,
        logit_soft_cap=logit_soft_cap,
    )
    check_bool("zero_unattended_keys", zero_unattended_keys)
    scale = resolved_scale(scale, query.shape[-1])
    if bias is not None:  # a `-inf` bias masks its key on every kernel (`keras_attn.core.softmax.bias_mask`)
        mask = merge_masks(mask, bias_mask(bias))
    if mask is not None and zero_unattended_keys:
        key, value = _zero_unattended_keys(key, value, mask)
    query_segment_ids, key_segment_ids = resolve_segment_ids(
        segment_ids, query_segment_ids, key_segment_ids, query.shape[1], key.shape[1], query.shape[0]
    )
    if key_segment_ids is not None:  # padding keys: no NaN they hold reaches an output
        key_is_real = ops.not_equal(key_segment_ids, 0)
        key, value = zero_padding(key, key_is_real), zero_padding(value, key_is_real)

    call = AttentionCall(
        query=query,
        key=key,  # (batch, key_len, kv_heads, depth)
        value=value,  # (batch, key_len, kv_heads, value_depth)
        mask=mask,
        bias=bias,
        pattern=pattern,
        query_offset=query_offset,
        scale=scale,
        dropout_rate=dropout_rate if training else 0.0,
        seed_generator=seed_generator,
        return_weights=return_weights,
        hard=hard,
        position_bias=check_position_bias(position_bias, query.shape[2]),
        query_segment_ids=query_segment_ids,
        key_segment_ids=key_segment_ids,
        logit_soft_cap=logit_soft_cap,
        training=bool(training),
    )
    implementation = _choose_implementation(implementation, call)
    return KERNELS[implementation].attend(call)


def _choose_implementation(implementation, call):
    """The name of the kernel `implementation` resolves to for this `AttentionCall`.

    A named kernel must take the call (else a `ValueError` with the kernel's reason); `"auto"`
    takes `keras_attn.dispatch.cost_model.choose(call)`.
    """
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {ATTENTION_IMPLEMENTATIONS}. Received: implementation={implementation!r}"
        )
    if implementation != "auto":
        reason = KERNELS[implementation].why_unsupported(call)
        if reason:
            raise ValueError(f"`implementation={implementation!r}` needs {reason}")
        return implementation
    return cost_model.choose(call)
