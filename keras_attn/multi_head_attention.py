"""Multi-head attention: a subclass of `keras.layers.MultiHeadAttention` with exact masking and fast paths."""

import keras
import tensorflow as tf
from keras import ops

from keras_attn import patterns
from keras_attn import position_bias as position_biases
from keras_attn import projections
from keras_attn import window_cache
from keras_attn.attention import scaled_dot_product_attention
from keras_attn.capabilities import AttentionCapabilities
from keras_attn.capabilities import check_call
from keras_attn.masks import pattern_mask
from keras_attn.mask_arguments import as_4d_mask
from keras_attn.mask_arguments import check_mask_shapes
from keras_attn.mask_arguments import merged_mask
from keras_attn.multi_head_arguments import checked_pattern
from keras_attn.softmax import zero_masked
from keras_attn.utils import keras_mask
from keras_attn.validation import check_position
from keras_attn.validation import check_positive_int

_SEQUENCE_AXIS = (1,)  # the attention axes of (batch, seq, features) inputs, resolved


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention (Vaswani et al., 2017) with exact masking on every path.

    A drop-in replacement for `keras.layers.MultiHeadAttention`, and a subclass of it: the same
    constructor arguments, `call` signature, attribute names (`_query_dense`, `_key_dense`,
    `_value_dense`, `_output_dense`), weights (they copy across with `set_weights`), quantization
    (`Model.quantize`) and subclass hook (`_compute_attention`). Keras's own test file for the
    layer runs against this class (`tests/test_keras_multi_head_attention_suite.py`). On top of it:

    - a query row whose keys are all masked yields all-zero attention weights (Keras gives
      uniform weights on some paths); softmax always runs in float32;
    - one fused QKV matmul when `query`, `key` and `value` are the same tensor;
    - `num_key_value_heads` for grouped-query (and, with 1, multi-query) attention;
    - an additive `attention_bias` call argument, and a `position_bias` layer (`keras_attn.ALiBi`,
      `keras_attn.RelativePositionBias`) that every kernel computes block by block from positions;
    - explicit `query_mask` / `value_mask` / `key_mask` arguments are always honoured,
      Keras masks (`Embedding(mask_zero=True)` upstream) are used when they are not given.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        value_dim: size of each head for value; defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections use bias vectors.
        output_shape: the output's trailing shape (int or tuple); defaults to the query's
            feature size.
        attention_axes: the axes attention runs over, as in Keras (default: all axes but the
            batch, the heads and the features). On `(batch, seq, features)` inputs attending
            over the sequence (the default) the dense, chunked and blockwise kernels of
            `keras_attn.attention` run; other ranks and axes run Keras's einsum path with this
            layer's masking rules (no cache, bias or grouped key/value heads there).
        sliding_window: optional positive int; each query attends to keys with
            `|i - j| < sliding_window` (local/band attention).
        flash_attention: accepted for compatibility with Keras; ignored.
        kernel_initializer: initializer of the projection kernels, as for `Dense`.
        bias_initializer: initializer of the projection biases, as for `Dense`.
        kernel_regularizer: as for `Dense`.
        bias_regularizer: as for `Dense`.
        activity_regularizer: as for `Dense`.
        kernel_constraint: as for `Dense`.
        bias_constraint: as for `Dense`.
        use_gate: if `True`, a sigmoid gate computed from the query multiplies the
            attention output per head before the output projection (as in Keras).
        seed: seed for attention dropout.
        num_key_value_heads: number of key/value heads; must divide `num_heads`.
            Defaults to `num_heads`.
        implementation: `"auto"` (default), `"dense"`, `"chunked"` or `"blockwise"`, as for
            `keras_attn.attention.scaled_dot_product_attention`: chunked attention skips the
            keys a causal or sliding-window mask hides; blockwise attention keeps memory linear
            in the sequence length; `"auto"` picks between them by length when the attention
            scores are not returned.
        scale: the inverse temperature beta of the softmax, `softmax(beta * Q K^T)`: a
            positive number, or `None` (default) for Keras's `1 / sqrt(key_dim)`.
        hard: if `True`, hard attention: each query takes the value of its allowed key with
            the largest logit (ties: the lowest index), with straight-through gradients through
            the softmax at `scale` (see `scaled_dot_product_attention`); the returned scores
            are the one-hot weights. Runs on the dense kernel.
        attention_pattern: optional `keras_attn.patterns.Pattern` (or its config): which keys
            each query position may attend to, intersected with `use_causal_mask`,
            `sliding_window` and the masks; with a cache the queries sit at
            `cache_update_index`. Serialised with the layer's config.
        position_bias: optional `keras_attn.position_bias.PositionBias` layer (or its config)
            for `num_heads` heads, e.g. `keras_attn.ALiBi(num_heads)`: its bias is added to the
            logits on every call, computed per block from the positions (the queries sit at
            `cache_update_index` with a cache). Its weights are this layer's; it is serialised
            with the config.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments (the one convention of every keras_attn attention family; what a family
    supports is its `capabilities`, `keras_attn.capabilities.AttentionCapabilities`):
        query: `(batch, query_len, query_features)`.
        value: `(batch, key_len, value_features)`; `None` (the default) for self-attention,
            `value = query`.
        key: optional `(batch, key_len, key_features)`; defaults to `value`.
        query_mask: optional boolean `(batch, query_len)`; `False` rows get zero attention.
            The Keras mask of `query` when not given.
        value_mask: optional boolean `(batch, key_len)`; `False` keys are never attended.
            The Keras mask of `value` (of `query` when `value` is `None`) when not given.
        key_mask: optional boolean `(batch, key_len)`; combined with `value_mask`.
        attention_mask: optional boolean mask broadcastable to `(query_len, key_len)` or
            `(batch, query_len, key_len)` (2-D/3-D, as in Keras) or
            `(batch, heads, query_len, key_len)` (4-D).
        return_attention_scores: if `True`, also return the weights
            `(batch, heads, query_len, key_len)`.
        training: whether dropout is active.
        use_causal_mask: if `True`, query `i` attends only to keys `j <= i`.
        attention_bias: optional additive float bias broadcastable to
            `(batch, heads, query_len, key_len)`.
        cache: optional key/value cache `(batch, 2, max_len, kv_heads, key_dim)` for
            incremental decoding (`cache[:, 0]` keys, `cache[:, 1]` values; `key_dim` must
            equal `value_dim`). With `cache_update_index`, the new `key`/`value` tokens are
            projected and written into the cache at that index and attention runs over the
            whole cache (`use_causal_mask` and `sliding_window` are then aligned so that the
            queries sit at `cache_update_index`). Without it, the cache is used as
            precomputed keys/values (cross-attention to an encoder projected once) and
            `key`/`value` are ignored. Padding masks given with a cache are over `max_len`.
            With `sliding_window=W` a cache of `W` slots (`initial_cache(batch, max_length)`
            gives one for `max_length > W`) is a ring buffer (`keras_attn.window_cache`), for
            causal calls only: the new tokens attend over the `W` slots as received then
            themselves, with the pattern and position bias at the keys' true positions, and
            are written at `index % W`; key masks, `attention_mask`, `attention_bias` and the
            returned scores cover those `W + query_len` keys (key masks: the `W` slots).
        cache_update_index: int or scalar int tensor, the position of the first new token.

    Returns:
        `(batch, query_len, output_features)`; then the attention weights when
        `return_attention_scores=True`; then the updated cache when `cache` is given.

    Subclass hook: override `_compute_attention` (Keras's override point) to replace the
    attention computation while keeping the projections, masks, cache, gate and output
    projection; its docstring states the contract. A non-softmax family (mean, linear, ...)
    plugs in there.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 64, mask_zero=True)(tokens)
    >>> x = MultiHeadAttention(num_heads=4, key_dim=16)(x, x, use_causal_mask=True)
    >>> model = keras.Model(tokens, x)
    >>> output, scores = MultiHeadAttention(num_heads=4, key_dim=16)(x, x, return_attention_scores=True)
    >>> tuple(output.shape), tuple(scores.shape)
    ((None, None, 64), (None, 4, None, None))
    """

    capabilities = AttentionCapabilities(
        causal=True, cross=True, padding_mask=True, attention_mask=True, cache="key_value", scores=True, onnx=True,
        softmax=True,
    )
    causal = False  # a subclass with `causal = True` (`CausalSelfAttention`) is causal on every call

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        num_key_value_heads=None,
        implementation="auto",
        scale=None,
        hard=False,
        attention_pattern=None,
        position_bias=None,
        **kwargs,
    ):
        attention_pattern = checked_pattern(
            num_heads=num_heads, key_dim=key_dim, value_dim=value_dim, dropout=dropout, use_bias=use_bias,
            output_shape=output_shape, attention_axes=attention_axes, sliding_window=sliding_window,
            flash_attention=flash_attention, use_gate=use_gate, num_key_value_heads=num_key_value_heads,
            implementation=implementation, scale=scale, hard=hard, attention_pattern=attention_pattern,
        )
        super().__init__(
            num_heads,
            key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=attention_axes,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            **kwargs,
        )
        self._num_key_value_heads = num_key_value_heads or num_heads
        self.implementation = implementation
        self._scale = scale
        if scale is not None:
            self._inverse_sqrt_key_dim = scale  # the scale of Keras's einsum path and of the hook
        self._hard = hard
        self._attention_pattern = attention_pattern
        self._position_bias = position_biases.check_position_bias(position_biases.get(position_bias), num_heads)
        self._sequence_attention = None  # set by `build`: rank-3 inputs attending over axis 1

    def initial_cache(self, batch_size, max_length):
        """An all-zero self-attention cache for decoding up to `max_length` positions:
        `(batch_size, 2, cache_length, num_key_value_heads, key_dim)` in the compute dtype.

        `cache_length` is `max_length`, or with `sliding_window=W` `min(W, max_length)`: a window
        cache is a ring buffer (`keras_attn.window_cache`), its size constant in the position.
        Needs `key_dim == value_dim`, as every cache does. The sizes may be scalar int tensors
        (a batch known when a graph runs).
        """
        for name, size in (("batch_size", batch_size), ("max_length", max_length)):
            if not ops.is_tensor(size):
                check_positive_int(name, size)
        length = window_cache.cache_length(self._sliding_window, max_length)
        return ops.zeros((batch_size, 2, length, self._num_key_value_heads, self._key_dim), self.compute_dtype)

    @property
    def num_key_value_heads(self):
        return self._num_key_value_heads

    @property
    def position_bias(self):
        return self._position_bias

    @property
    def sliding_window(self):
        return self._sliding_window

    @property
    def use_gate(self):
        return self._use_gate

    @property
    def scale(self):
        return self._scale

    @property
    def hard(self):
        return self._hard

    @property
    def attention_pattern(self):
        return self._attention_pattern

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape  # self-attention
        key_shape = value_shape if key_shape is None else key_shape
        _check_input_shapes(query_shape, value_shape, key_shape)
        _check_attention_axes(self._attention_axes, query_shape)
        self._sequence_attention = _attends_over_the_sequence(
            query_shape, value_shape, key_shape, self._attention_axes, self._output_shape
        )
        if not self._sequence_attention:
            sequence_only = {
                "num_key_value_heads": self._num_key_value_heads if self._num_key_value_heads != self._num_heads else None,
                "sliding_window": self._sliding_window,
                "implementation": self.implementation if self.implementation not in ("auto", "dense") else None,
                "hard": True if self._hard else None,
                "attention_pattern": self._attention_pattern,
                "position_bias": self._position_bias,
            }
            for name, value in sequence_only.items():
                if value is not None:
                    raise ValueError(
                        f"`{name}` needs (batch, seq, features) inputs attending over axis 1 and a 1-D "
                        f"`output_shape`. Received: {name}={value!r}, query_shape={tuple(query_shape)}, "
                        f"attention_axes={self._attention_axes}, output_shape={self._output_shape}"
                    )
            super().build(query_shape, value_shape, key_shape)  # Keras's einsum projections
            return
        self._query_dense = projections.projection(self, "query", self._num_heads, self._key_dim)
        self._query_dense.build(query_shape)
        self._key_dense = projections.projection(self, "key", self._num_key_value_heads, self._key_dim)
        self._key_dense.build(key_shape)
        # The gate is built before the value projection: Keras's weight order for `set_weights`.
        if self._use_gate:
            self._gate_dense = projections.projection(self, "gate", self._num_heads, self._value_dim, activation="sigmoid")
            self._gate_dense.build(query_shape)
        self._value_dense = projections.projection(self, "value", self._num_key_value_heads, self._value_dim)
        self._value_dense.build(value_shape)
        self._build_attention(4)  # Keras's einsum equations and softmax, for the `_compute_attention` hook
        self._output_dense = self._make_output_dense(
            query_shape, self._get_common_kwargs_for_sublayer(), "attention_output"
        )
        self._output_dense.build((None, None, self._num_heads, self._value_dim))

    def _dropout_seed_generator(self):
        """The seed generator of Keras's attention dropout layer (one per layer, as in Keras), or `None`."""
        return self._dropout_layer.seed_generator if self._dropout > 0 else None

    def _fused_qkv(self, inputs):
        """One matmul for the query, key and value projections of the same tensor."""
        return projections.fused_qkv(self, inputs)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        attention_bias=None,
        cache=None,
        cache_update_index=None,
    ):
        check_call(self, query, value, key)
        use_causal_mask = use_causal_mask or self.causal
        if value is None:  # self-attention: Keras fills the masks of two tensor arguments, not of one
            value = query
            query_mask = keras_mask(query) if query_mask is None else query_mask
            value_mask = keras_mask(query) if value_mask is None else value_mask
        if key is None:
            key = value
        if not self._sequence_attention:
            return self._call_over_attention_axes(
                query, value, key, query_mask, value_mask, key_mask, attention_mask,
                return_attention_scores, training, use_causal_mask, attention_bias, cache, cache_update_index,
            )
        ring = cache is not None and window_cache.is_window_cache(self._sliding_window, cache, cache_update_index)
        if ring:  # key masks cover the slots as received; the new tokens are keys too
            window_cache.check_causal(use_causal_mask, self._sliding_window, cache)
            value_mask, key_mask = (
                window_cache.extend_key_mask(name, padding, self._sliding_window, ops.shape(query)[1])
                for name, padding in (("value_mask", value_mask), ("key_mask", key_mask))
            )
        elif cache_update_index is not None and query_mask is not None:
            query_mask = _query_rows(query_mask, query, cache_update_index)
        mask = merged_mask(query_mask, value_mask, key_mask, attention_mask)
        if cache is None:
            if cache_update_index is not None:
                raise ValueError(
                    "`cache_update_index` needs a `cache`. Received: cache=None, "
                    f"cache_update_index={cache_update_index}"
                )
            projected_query, projected_key, projected_value = projections.project(self, query, key, value)
        else:
            projected_query, projected_key, projected_value, cache = self._update_cache(
                cache, query, key, value, cache_update_index
            )
        check_mask_shapes(
            projected_query,
            projected_key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
        )
        offset = 0 if cache_update_index is None else cache_update_index
        pattern, sliding_window, position_bias, bias = (
            self._attention_pattern, self._sliding_window, self._position_bias, attention_bias
        )
        if ring:  # the pattern and position bias at the keys' true positions, in the mask and the bias
            mask, bias = window_cache.mask_and_bias(self, mask, attention_bias, use_causal_mask, offset, ops.shape(query)[1])
            use_causal_mask, offset, pattern, sliding_window, position_bias = False, 0, None, None, None
        if _overrides_compute_attention(self):
            attended, weights = self._hooked_attention(
                projected_query, projected_key, projected_value, mask, attention_bias,
                patterns.from_shorthands(pattern, use_causal_mask, sliding_window), offset, training,
                return_attention_scores,
            )
            return self._finish(query, attended, weights, cache, return_attention_scores)
        # (batch, query_len, heads, value_dim)[, (batch, heads, query_len, key_len)]
        attention = scaled_dot_product_attention(
            projected_query,
            projected_key,
            projected_value,
            mask=mask,
            bias=bias,
            is_causal=bool(use_causal_mask),  # Keras takes any truthy value
            sliding_window=sliding_window,
            pattern=pattern,
            query_offset=offset,
            scale=self._scale,
            dropout_rate=self.dropout,
            training=training,
            seed_generator=self._dropout_seed_generator(),
            return_weights=return_attention_scores,
            implementation=self.implementation,
            hard=self._hard,
            position_bias=position_bias,
        )
        attended, weights = attention if return_attention_scores else (attention, None)
        return self._finish(query, attended, weights, cache, return_attention_scores)

    def _finish(self, query, attended, weights, cache, return_attention_scores):
        """The gate and the output projection; `output[, weights][, cache]`."""
        if self._use_gate:
            attended = attended * self._gate_dense(query)
        output = projections.output_projection(self, attended)  # (batch, query_len, output_dim)
        results = (output,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _hooked_attention(
        self, projected_query, projected_key, projected_value, mask, attention_bias, pattern, offset, training,
        return_attention_scores,
    ):
        """A subclass's `_compute_attention`, called as Keras calls it: every mask merged (`pattern`
        with the queries at `offset`), no causal flag."""
        if attention_bias is not None:
            raise ValueError(
                "`attention_bias` cannot reach an overridden `_compute_attention` (its signature has no "
                f"bias). Received: attention_bias.shape={tuple(attention_bias.shape)}"
            )
        if self._position_bias is not None:
            raise ValueError(
                "`position_bias` cannot reach an overridden `_compute_attention` (its signature has no "
                f"bias). Received: position_bias={self._position_bias!r}"
            )
        query_len, key_len = ops.shape(projected_query)[1], ops.shape(projected_key)[1]
        mask = pattern_mask(mask, pattern, query_len, key_len, offset)
        return self._compute_attention(
            projected_query, projected_key, projected_value, mask, training, return_attention_scores
        )

    def _call_over_attention_axes(
        self, query, value, key, query_mask, value_mask, key_mask, attention_mask,
        return_attention_scores, training, use_causal_mask, attention_bias, cache, cache_update_index,
    ):
        """Keras's einsum path for other ranks, axes and output shapes, with this layer's masking rules."""
        unsupported = {"attention_bias": attention_bias, "cache": cache, "cache_update_index": cache_update_index}
        for name, given in unsupported.items():
            if given is not None:
                raise ValueError(
                    f"`{name}` needs (batch, seq, features) inputs attending over axis 1 and a 1-D "
                    f"`output_shape`. Received: query.shape={tuple(query.shape)}, "
                    f"attention_axes={self._attention_axes}, output_shape={self._output_shape}"
                )
        mask = self._compute_attention_mask(
            query, value, query_mask=query_mask, value_mask=value_mask, key_mask=key_mask,
            attention_mask=attention_mask, use_causal_mask=use_causal_mask,
        )
        gate = self._gate_dense(query) if self._use_gate else None
        attended, weights = self._compute_attention(
            self._query_dense(query), self._key_dense(key), self._value_dense(value), mask, training,
            return_attention_scores,
        )
        if gate is not None:
            attended = attended * gate
        output = self._output_dense(attended)
        return (output, weights) if return_attention_scores else output

    def _compute_attention(
        self, query, key, value, attention_mask=None, training=None, return_attention_scores=False,
        use_causal_mask=False,
    ):
        """The attention computation over projected tensors: `(output, scores or None)`.

        The documented subclass hook (Keras's `_compute_attention`, same arguments). `call`
        projects the inputs, merges every mask, calls this method, then applies the gate and
        the output projection; overriding it swaps the attention family and keeps the rest.

        Contract, for `(batch, seq, features)` inputs attending over the sequence:

        Args:
            query: `(batch, query_len, num_heads, key_dim)`, projected, not yet scaled.
            key: `(batch, key_len, num_key_value_heads, key_dim)` (with a cache: the whole
                cache, `key_len = max_len`); `num_heads` is a multiple of its heads.
            value: `(batch, key_len, num_key_value_heads, value_dim)`.
            attention_mask: `None` (every key allowed) or a boolean tensor broadcastable to
                `(batch, num_heads, query_len, key_len)` (2-D and 3-D masks, as Keras takes
                them, broadcast as `(query_len, key_len)` / `(batch, query_len, key_len)`);
                `True` where the query may attend to the key. When `call` invokes an override
                it is every mask merged: the padding masks, `attention_mask`, the causal mask,
                `sliding_window` and `attention_pattern` (queries at `cache_update_index`
                with a cache), and `use_causal_mask` is `False`.
            training: whether dropout is active.
            return_attention_scores: whether to return the weights.
            use_causal_mask: adds the causal mask to `attention_mask` (direct calls only).

        Returns:
            `(output, scores)`: the output `(batch, query_len, num_heads, value_dim)` in the
            compute dtype, and the weights `(batch, num_heads, query_len, key_len)` when
            `return_attention_scores`, else `None`. A query row without any allowed key must
            give a zero output (and zero weights), the library's contract for every family.

        This implementation runs `keras_attn.attention.scaled_dot_product_attention` with the
        layer's `scale`, `hard`, dropout and `implementation` on rank-4 tensors, and Keras's
        einsum with this layer's masked softmax for more attention axes. An `attention_bias`
        cannot reach an override (a `ValueError` says so).
        """
        if len(query.shape) == 4:
            mask = None if attention_mask is None else as_4d_mask(attention_mask)
            attention = scaled_dot_product_attention(
                query, key, value, mask=mask, is_causal=bool(use_causal_mask), scale=self._scale,
                dropout_rate=self._dropout, training=training, seed_generator=self._dropout_seed_generator(),
                return_weights=return_attention_scores, implementation=self.implementation, hard=self._hard,
            )
            return attention if return_attention_scores else (attention, None)
        if use_causal_mask:
            causal = self._compute_causal_mask(query, value)  # (1, query_len, key_len)
            attention_mask = causal if attention_mask is None else ops.logical_and(
                ops.cast(attention_mask, "bool"), causal
            )
        return super()._compute_attention(query, key, value, attention_mask, training, return_attention_scores)

    def _masked_softmax(self, attention_scores, attention_mask=None):
        """Keras's masked softmax, then exact zeros at masked entries: a fully masked row is all zero."""
        weights = super()._masked_softmax(attention_scores, attention_mask)
        if attention_mask is None:
            return weights
        mask = ops.cast(attention_mask, "bool")
        for _ in range(len(attention_scores.shape) - len(mask.shape)):
            mask = ops.expand_dims(mask, axis=-len(self._attention_axes) * 2 - 1)  # Keras's expansion
        return zero_masked(weights, mask)

    def _update_cache(self, cache, query, key, value, cache_update_index):
        """Returns the query, the keys and values to attend over and the cache, writing new tokens if asked."""
        expected = (2, self.num_key_value_heads, self.key_dim)
        if len(cache.shape) != 5 or (cache.shape[1], cache.shape[3], cache.shape[4]) != expected:
            raise ValueError(
                f"`cache` must have shape (batch, 2, max_len, {self.num_key_value_heads}, "
                f"{self.key_dim}). Received: cache.shape={tuple(cache.shape)}"
            )
        if self.key_dim != self.value_dim:
            raise ValueError(
                "A key/value cache needs `key_dim == value_dim`. Received: "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}"
            )
        if cache.shape[0] is not None and query.shape[0] is not None and cache.shape[0] != query.shape[0]:
            raise ValueError(
                "`cache` must have the batch size of `query`. "
                f"Received: cache.shape={tuple(cache.shape)}, query.shape={tuple(query.shape)}"
            )
        if cache_update_index is None:
            projected_query = self._query_dense(query)
        else:
            projected_query, new_key, new_value = projections.project(self, query, key, value)
            new_entries = ops.stack((new_key, new_value), axis=1)  # (batch, 2, query_len, kv_heads, dim)
            if window_cache.is_window_cache(self._sliding_window, cache, cache_update_index):
                check_position("cache_update_index", cache_update_index)  # a ring buffer has no end
                entries = window_cache.attended(cache, new_entries)  # (batch, 2, window + query_len, kv_heads, dim)
                cache = window_cache.written(entries, cache.shape[2], cache_update_index)
                return projected_query, entries[:, 0], entries[:, 1], cache
            cache_update_index = _check_cache_bounds(cache_update_index, ops.shape(new_key)[1], ops.shape(cache)[2])
            # One write of the new tokens into the cache; it is never re-assembled from K and V.
            cache = ops.slice_update(cache, (0, 0, cache_update_index, 0, 0), ops.cast(new_entries, cache.dtype))
        return projected_query, cache[:, 0], cache[:, 1], cache  # keys, values: (batch, max_len, kv_heads, dim)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        """Keras's output shape; `value_shape=None` is self-attention (the query's)."""
        return super().compute_output_shape(query_shape, query_shape if value_shape is None else value_shape, key_shape)

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        attention_bias=None,
        cache=None,
        cache_update_index=None,
    ):
        """Symbolic `output[, scores][, cache]`, as `call` returns them."""
        value = query if value is None else value
        key_shape = None if key is None else key.shape
        # Keras's shape rule, also for subclasses whose `compute_output_shape` takes other arguments.
        output_shape = keras.layers.MultiHeadAttention.compute_output_shape(self, query.shape, value.shape, key_shape)
        output = keras.KerasTensor(output_shape, self.compute_dtype)
        results = (output,)
        if return_attention_scores:
            if len(query.shape) != 3:  # the scores' axes follow `attention_axes`: trace them
                return keras.src.backend.compute_output_spec(
                    self.call, query, value, key, query_mask, value_mask, key_mask, attention_mask,
                    True, training, use_causal_mask,
                )
            key_len = cache.shape[2] if cache is not None else value.shape[1]
            if cache is not None and window_cache.is_window_cache(self._sliding_window, cache, cache_update_index):
                key_len = None if query.shape[1] is None else key_len + query.shape[1]  # the slots, then the new tokens
            results += (keras.KerasTensor((query.shape[0], self._num_heads, query.shape[1], key_len), self.compute_dtype),)
        if cache is not None:
            results += (keras.KerasTensor(cache.shape, cache.dtype),)
        return results[0] if len(results) == 1 else results

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_key_value_heads": self._num_key_value_heads,
                "implementation": self.implementation,
                "scale": self._scale,
                "hard": self._hard,
                "attention_pattern": keras.saving.serialize_keras_object(self._attention_pattern),
                "position_bias": keras.saving.serialize_keras_object(self._position_bias),
            }
        )
        return config


def _check_input_shapes(query_shape, value_shape, key_shape):
    """ValueError naming the input whose rank or shape cannot work, with what was received."""
    shapes = {"query": tuple(query_shape), "value": tuple(value_shape), "key": tuple(key_shape)}
    if shapes["value"][1:-1] != shapes["key"][1:-1]:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must be equal. "
            f"Received: value.shape={shapes['value']}, key.shape={shapes['key']}"
        )
    for name, shape in shapes.items():
        if len(shape) < 3:
            raise ValueError(f"`{name}` must have rank >= 3 (batch, ..., features). Received: {name}.shape={shape}")
    if len({len(shape) for shape in shapes.values()}) > 1:
        raise ValueError(
            "`query`, `value` and `key` must have the same rank. Received: "
            + ", ".join(f"{name}.shape={shape}" for name, shape in shapes.items())
        )


def _resolved_axes(attention_axes, rank):
    return None if attention_axes is None else tuple(axis + rank if axis < 0 else axis for axis in attention_axes)


def _check_attention_axes(attention_axes, query_shape):
    """ValueError unless every attention axis lies between the batch axis and the feature axis."""
    rank = len(query_shape)
    for axis in _resolved_axes(attention_axes, rank) or ():
        if not 1 <= axis <= rank - 2:
            raise ValueError(
                f"`attention_axes` must name axes between the batch and the feature axis (1 to {rank - 2} "
                f"for rank-{rank} inputs). Received: attention_axes={attention_axes}, query_shape={tuple(query_shape)}"
            )


def _attends_over_the_sequence(query_shape, value_shape, key_shape, attention_axes, output_shape):
    """Whether the inputs are `(batch, seq, features)` attending over axis 1 with a 1-D output shape."""
    ranks = {len(query_shape), len(value_shape), len(key_shape)}
    axes = _resolved_axes(attention_axes, len(query_shape))
    return ranks == {3} and axes in (None, _SEQUENCE_AXIS) and (output_shape is None or len(output_shape) == 1)


def _overrides_compute_attention(layer):
    return type(layer)._compute_attention is not MultiHeadAttention._compute_attention


def _check_cache_bounds(cache_update_index, new_len, max_len):
    """`cache_update_index`, checked so that the `new_len` new tokens fit in the `max_len` cache:
    a ValueError when everything is known now, else a run-time assertion (`ops.slice_update`
    would silently clamp the index and overwrite the last slots)."""
    if not isinstance(cache_update_index, int):  # a float would be truncated; ints get the bounds below
        check_position("cache_update_index", cache_update_index)
    known = all(isinstance(v, int) for v in (cache_update_index, new_len, max_len))
    if known:
        if isinstance(cache_update_index, bool) or not 0 <= cache_update_index <= max_len - new_len:
            raise ValueError(
                f"`cache_update_index` must be in [0, {max_len - new_len}] for {new_len} new tokens in a cache "
                f"of length {max_len}. Received: cache_update_index={cache_update_index!r}"
            )
        return cache_update_index
    index = tf.cast(cache_update_index, "int32")
    fits = tf.logical_and(index >= 0, index + tf.cast(new_len, "int32") <= tf.cast(max_len, "int32"))
    check = tf.debugging.Assert(
        fits, ["`cache_update_index` out of the cache: cache_update_index=", index, "new tokens:", new_len,
               "cache length:", max_len]
    )
    with tf.control_dependencies([check]):
        return tf.identity(index)


def _query_rows(query_mask, query, cache_update_index):
    """The rows of a `(batch, max_len)` query mask over the cache that belong to `query`."""
    if query_mask.shape[1] is not None and query_mask.shape[1] == query.shape[1]:
        return query_mask  # already over the queries (e.g. the Keras mask of `query`)
    # Decided at run time when a length is unknown statically (e.g. inside a `while_loop`); a
    # mask as long as the queries is over the queries (over the cache it would need index 0).
    query_len = ops.shape(query)[1]
    over_queries = ops.equal(ops.shape(query_mask)[1], query_len)
    start = ops.where(over_queries, 0, ops.cast(cache_update_index, "int32"))
    return ops.slice(query_mask, (0, start), (ops.shape(query_mask)[0], query_len))

