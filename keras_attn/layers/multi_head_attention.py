"""Multi-head attention: a subclass of `keras.layers.MultiHeadAttention` with exact masking and fast paths.

The class keeps Keras's hooks and the public API; its parts live beside it, one concept each:
`multi_head_arguments` (the constructor checks), `projections` (fused QKV, output projection),
`mask_arguments` (merging and checking the mask arguments), `key_value_cache` (what a cached call
attends over; the ring buffer is `window_cache`) and `keras_compatibility` (Keras's route for
other axes, a subclass's `_compute_attention` hook, the shape and axes checks); `attention_axes`
flattens several attention axes into one sequence for the kernels.
"""

import keras
from keras import ops

from keras_attn import keras_internals
from keras_attn.core import position_bias as position_biases
from keras_attn.core.masks import either_mask
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import zero_masked
from keras_attn.core.masks import zero_padding
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.layers import attention_axes
from keras_attn.layers import keras_compatibility
from keras_attn.layers import key_value_cache
from keras_attn.layers import projections
from keras_attn.layers import segment_arguments
from keras_attn.layers import window_cache
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.layers.capabilities import check_call
from keras_attn.layers.hub_adapters.causal_masks import within_causal_pattern
from keras_attn.layers.mask_arguments import as_4d_mask
from keras_attn.layers.mask_arguments import check_mask_shapes
from keras_attn.layers.mask_arguments import merged_mask
from keras_attn.layers.mask_arguments import rows_with_keys
from keras_attn.layers.multi_head_arguments import check_scores_allowed
from keras_attn.layers.multi_head_arguments import checked_pattern
from keras_attn.layers.multi_head_arguments import kernel_name
from keras_attn.utils import keras_mask
from keras_attn.validation import check_choice
from keras_attn.validation import check_projection_sizes

ROWS_WITHOUT_KEYS = ("zero", "keras")  # `rows_without_keys`: keras_attn's zero, or Keras's layer's output


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
      Keras masks (`Embedding(mask_zero=True)` upstream) are used when they are not given;
    - padding outputs exact zeros and stays out of the gradients: a padded query position, and
      a query row whose keys the masks all exclude, outputs exactly zero (not the output
      projection's bias); the padded positions of `query`, `key` and `value` are set to zero by
      selection before the projections, so whatever they hold (NaN, inf) reaches no real output
      and no weight gradient.

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
            `keras_attn.dispatch.attention` run; other ranks and axes run Keras's einsum path with this
            layer's masking rules (no cache, bias or grouped key/value heads there): `query_mask`,
            `value_mask` and `key_mask` take the inputs' shapes without the features, and a query
            without any allowed key outputs zeros (`keras_attn.layers.attention_axes`).
        sliding_window: optional positive int; each query attends to keys with
            `|i - j| < sliding_window` (local/band attention).
        flash_attention: `None` (default): `implementation` picks the kernel. `True`: never
            materialise the `(query_len, key_len)` attention matrix: `"auto"` runs the blockwise
            kernel (memory linear in the length, dropout included), `implementation` may name
            `"blockwise"` or `"strided"`, and, as in Keras, `return_attention_scores=True` is a
            `ValueError`. `False`: the dense kernel. A conflicting `implementation` or `hard=True`
            is a `ValueError` naming both. Keras's global `keras.config.enable_flash_attention()`
            does not reach this layer.
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
            `keras_attn.dispatch.attention.scaled_dot_product_attention`: chunked attention skips the
            keys a causal or sliding-window mask hides; blockwise attention keeps memory linear
            in the sequence length; `"auto"` takes the kernel measured fastest (the lightest within
            10 % of it) among those predicted to hold no more than Keras's dense attention
            (`keras_attn.explain_implementation`),
            the dense one when the attention scores are returned.
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
        position_bias: optional `keras_attn.core.position_bias.PositionBias` layer (or its config)
            for `num_heads` heads, e.g. `keras_attn.ALiBi(num_heads)`: its bias is added to the
            logits on every call, computed per block from the positions (the queries sit at
            `cache_update_index` with a cache). Its weights are this layer's; it is serialised
            with the config.
        rows_without_keys: what a query row with no allowed key (a padded query, or one whose
            keys the masks all exclude) outputs. `"zero"` (default): exactly zero, and the padded
            positions of `query`, `key` and `value` are zeroed before the projections (see
            above). `"keras"`: what `keras.layers.MultiHeadAttention` outputs: the output
            projection (its bias included) of the mean of the projected values over all the
            keys, padded ones included (of zero weights when the layer has dropout or returns
            its scores, Keras's other path), with Keras's gradients; nothing is zeroed.
            `keras_attn.convert` sets it, so a converted model keeps its Keras layer's outputs.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments (the one convention of every keras_attn attention family; what a family
    supports is its `capabilities`, `keras_attn.layers.capabilities.AttentionCapabilities`):
        query: `(batch, query_len, query_features)`.
        value: `(batch, key_len, value_features)`; `None` (the default) for self-attention,
            `value = query`.
        key: optional `(batch, key_len, key_features)`; defaults to `value`.
        query_mask: optional boolean `(batch, query_len)`, the real query positions (Keras's
            meaning, the same in every keras_attn family): a `False` row outputs exactly zero
            and reaches no weight gradient. It masks no key, also in self-attention: keys are
            masked by `value_mask` / `key_mask`. The Keras mask of `query` when not given.
        value_mask: optional boolean `(batch, key_len)`, the real keys: a `False` key is never
            attended. The Keras mask of `value` (of `query` when `value` is `None`, so a Keras
            mask on a self-attention input masks the queries and the keys) when not given.
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
            gives one for `max_length > W`) is a ring buffer (`keras_attn.layers.window_cache`), for
            causal calls only: the new tokens attend over the `W` slots as received then
            themselves, with the pattern and position bias at the keys' true positions, and
            are written at `index % W`; key masks, `attention_mask`, `attention_bias` and the
            returned scores cover those `W + query_len` keys (key masks: the `W` slots).
        cache_update_index: int or scalar int tensor, the position of the first new token.
        segment_ids: optional int `(batch, seq)` document ids of packed self-attention rows
            (several documents in one row, `0` for padding; `keras_attn.core.segments`): a query
            attends only to keys of its own document, intersected with every mask above
            (`use_causal_mask=True` is causal within each document, `sliding_window` a window
            within it). A padding query (id 0) outputs exactly zero and, like a padding key,
            reaches no output and no weight gradient whatever it holds.
        query_segment_ids: optional int `(batch, query_len)`, with `key_segment_ids`
            `(batch, key_len)`: the documents of cross-attention's queries and keys (the query of
            document `d` attends to the keys of document `d`). With a precomputed cache
            `key_segment_ids` covers its keys. In a cached step they are the new tokens' ids and
            the ids of the tokens the cache holds as received, `(batch, cache_len)`, a record the
            caller keeps beside the cache (all zeros when empty; after each step
            `next_cache_segment_ids(...)`; `keras_attn.layers.segment_arguments`).
        key_segment_ids: see `query_segment_ids`.

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
        causal=True,
        cross=True,
        padding_mask=True,
        attention_mask=True,
        cache="key_value",
        scores=True,
        onnx=True,
        softmax=True,
        segments=True,
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
        rows_without_keys="zero",
        **kwargs,
    ):
        attention_pattern = checked_pattern(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=attention_axes,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            use_gate=use_gate,
            num_key_value_heads=num_key_value_heads,
            implementation=implementation,
            scale=scale,
            hard=hard,
            attention_pattern=attention_pattern,
        )
        super().__init__(
            num_heads,
            key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=attention_axes,
            flash_attention=None,  # ours: Keras's refuses dropout, which our blockwise kernel applies
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            seed=seed,
            **keras_internals.newer_attention_arguments(sliding_window=sliding_window, use_gate=use_gate),
            **kwargs,
        )
        self._sliding_window = sliding_window  # Keras's attributes, which Keras < 3.15 does not set
        self._use_gate = use_gate
        self._init_own_state(
            num_key_value_heads,
            flash_attention,
            implementation,
            scale,
            hard,
            attention_pattern,
            position_bias,
            check_choice("rows_without_keys", rows_without_keys, ROWS_WITHOUT_KEYS),
        )

    def _init_own_state(
        self,
        num_key_value_heads=None,
        flash_attention=None,
        implementation="auto",
        scale=None,
        hard=False,
        attention_pattern=None,
        position_bias=None,
        rows_without_keys="zero",
    ):
        """The state this class adds to Keras's layer: set by `__init__`, and by `keras_attn.convert`
        on a Keras layer whose class it changes in place (already built, or not)."""
        # A layer that Keras < 3.15 built (then converted) has neither argument: Keras 3.15's defaults.
        self._sliding_window = getattr(self, "_sliding_window", None)
        self._use_gate = getattr(self, "_use_gate", False)
        self._num_key_value_heads = num_key_value_heads or self._num_heads
        self._flash_attention = flash_attention
        self.implementation = implementation
        self._scale = scale
        if scale is not None:
            self._inverse_sqrt_key_dim = scale  # the scale of Keras's einsum path and of the hook
        self._hard = hard
        self._attention_pattern = attention_pattern
        self._position_bias = position_biases.check_position_bias(position_biases.get(position_bias), self._num_heads)
        self._rows_without_keys = rows_without_keys
        # Rank-3 inputs attending over axis 1: set by `build`, or read from a built Keras layer's projections.
        self._sequence_attention = keras_compatibility.built_for_the_sequence(self) if self.built else None

    def initial_cache(self, batch_size, max_length):
        """An all-zero self-attention cache for decoding up to `max_length` positions:
        `(batch_size, 2, cache_length, num_key_value_heads, key_dim)` in the compute dtype.

        `cache_length` is `max_length`, or with `sliding_window=W` `min(W, max_length)`: a window
        cache is a ring buffer (`keras_attn.layers.window_cache`), its size constant in the position.
        Needs `key_dim == value_dim`, as every cache does. The sizes may be scalar int tensors
        (a batch known when a graph runs).
        """
        return key_value_cache.initial_cache(self, batch_size, max_length)

    def next_cache_segment_ids(self, cache, key_segment_ids, query_segment_ids, cache_update_index):
        """The segment ids of the tokens `cache` holds after a step: `key_segment_ids` `(batch,
        cache_len)` (before the step) with the step's `query_segment_ids` written where the step
        writes its keys (at `cache_update_index`, or into the ring buffer's slots). The record the
        next step takes as `key_segment_ids`; `cache` is the cache as the step received it."""
        return segment_arguments.next_cache_segment_ids(
            self, cache, key_segment_ids, query_segment_ids, cache_update_index
        )

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
    def flash_attention(self):
        return self._flash_attention

    @property
    def scale(self):
        return self._scale

    @property
    def hard(self):
        return self._hard

    @property
    def attention_pattern(self):
        return self._attention_pattern

    @property
    def rows_without_keys(self):
        return self._rows_without_keys

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape  # self-attention
        key_shape = value_shape if key_shape is None else key_shape
        keras_compatibility.check_input_shapes(query_shape, value_shape, key_shape)
        keras_compatibility.check_attention_axes(self._attention_axes, query_shape)
        widths = [shape[-1] for shape in (query_shape, value_shape, key_shape) if shape[-1] is not None]
        check_projection_sizes(self._num_heads, self._key_dim, self._value_dim, max(widths, default=None))
        self._sequence_attention = keras_compatibility.attends_over_the_sequence(
            query_shape, value_shape, key_shape, self._attention_axes, self._output_shape
        )
        if not self._sequence_attention:
            keras_compatibility.check_sequence_options(self, query_shape)
            super().build(query_shape, value_shape, key_shape)  # Keras's einsum projections
            if self._use_gate and not keras_internals.attention_takes("use_gate"):
                self._gate_dense = keras_compatibility.einsum_gate(self, query_shape)  # Keras < 3.15 has none
            return
        self._query_dense = projections.projection(self, "query", self._num_heads, self._key_dim)
        self._query_dense.build(query_shape)
        self._key_dense = projections.projection(self, "key", self._num_key_value_heads, self._key_dim)
        self._key_dense.build(key_shape)
        # The gate is built before the value projection: Keras's weight order for `set_weights`.
        if self._use_gate:
            self._gate_dense = projections.projection(
                self, "gate", self._num_heads, self._value_dim, activation="sigmoid"
            )
            self._gate_dense.build(query_shape)
        self._value_dense = projections.projection(self, "value", self._num_key_value_heads, self._value_dim)
        self._value_dense.build(value_shape)
        self._build_attention(4)  # Keras's einsum equations and softmax, for the `_compute_attention` hook
        self._output_dense = self._make_output_dense(
            query_shape, self._get_common_kwargs_for_sublayer(), "attention_output"
        )
        self._output_dense.build((None, None, self._num_heads, self._value_dim))

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
        segment_ids=None,
        query_segment_ids=None,
        key_segment_ids=None,
    ):
        check_call(
            self,
            query,
            value,
            key,
            projects_key=cache is None or cache_update_index is not None,
            segment_ids=segment_arguments.first_given(segment_ids, query_segment_ids, key_segment_ids),
        )
        check_scores_allowed(self._flash_attention, return_attention_scores)
        use_causal_mask = use_causal_mask or self.causal
        if value is None:  # self-attention: Keras fills the masks of two tensor arguments, not of one
            value = query
            query_mask = keras_mask(query) if query_mask is None else query_mask
            value_mask = keras_mask(query) if value_mask is None else value_mask
        if key is None:
            key = value
        if self._sequence_attention is None:  # converted before it was built: Keras's own `build` ran
            self._sequence_attention = keras_compatibility.built_for_the_sequence(self)
        if not self._sequence_attention:
            return keras_compatibility.call_over_attention_axes(
                self,
                query,
                value,
                key,
                query_mask,
                value_mask,
                key_mask,
                attention_mask,
                return_attention_scores,
                training,
                use_causal_mask,
                attention_bias,
                cache,
                cache_update_index,
                segment_arguments.first_given(segment_ids, query_segment_ids, key_segment_ids),
            )
        query_ids, key_ids = segment_arguments.call_segment_ids(
            self, query, key, segment_ids, query_segment_ids, key_segment_ids, cache, cache_update_index
        )
        ring = cache is not None and window_cache.is_window_cache(self._sliding_window, cache, cache_update_index)
        query_mask, value_mask, key_mask = key_value_cache.padding_masks(
            self, query, query_mask, value_mask, key_mask, use_causal_mask, cache, cache_update_index
        )
        check_mask_shapes(
            query.shape[0],
            query.shape[1],
            self._num_heads,
            key.shape[1]
            if cache is None
            else key_value_cache.key_length(self._sliding_window, cache, cache_update_index, query.shape[1]),
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
        )
        mask = merged_mask(query_mask, value_mask, key_mask, attention_mask)  # once their shapes are known to fit
        keras_rows = self._rows_without_keys == "keras"
        if not keras_rows:  # Keras's layer projects what the padded positions hold
            query, key, value = _padding_zeroed(
                query,
                key,
                value,
                merge_masks(query_mask, segment_arguments.real_tokens(query_ids)),
                merge_masks(value_mask, key_mask, segment_arguments.real_tokens(key_ids)),
                cache,
            )
        projected_query, projected_key, projected_value, cache = key_value_cache.projected(
            self, query, key, value, cache, cache_update_index
        )
        options = key_value_cache.attention_options(
            self,
            mask,
            attention_bias,
            use_causal_mask,
            ring,
            cache_update_index,
            ops.shape(query)[1],
            ops.shape(projected_key)[1],
        )
        options.update(query_segment_ids=query_ids, key_segment_ids=key_ids)
        if type(self)._compute_attention is MultiHeadAttention._compute_attention:
            # (batch, query_len, heads, value_dim)[, (batch, heads, query_len, key_len)]
            attended, weights = self._attend(
                projected_query, projected_key, projected_value, training, return_attention_scores, **options
            )
        else:  # a subclass's hook
            attended, weights = keras_compatibility.hooked_attention(
                self,
                projected_query,
                projected_key,
                projected_value,
                attention_bias,
                options,
                training,
                return_attention_scores,
            )
        if keras_rows:  # a row without keys keeps Keras's output: no row is zeroed
            attended = keras_compatibility.keras_rows(self, attended, projected_value, options, return_attention_scores)
            output_rows = None
        else:
            output_rows = merge_masks(
                rows_with_keys(mask, ops.shape(query)[1], projected_key.shape[1]),
                segment_arguments.rows_in_documents(mask, query_ids, key_ids),
            )
        return self._finish(query, attended, output_rows, weights, cache, return_attention_scores)

    def _attend(self, query, key, value, training, return_attention_scores, **options):
        """`scaled_dot_product_attention` with the layer's scale, dropout (the seed generator of Keras's
        dropout layer, one per layer), `implementation` and `hard`: `(output, weights or None)`."""
        attention = scaled_dot_product_attention(
            query,
            key,
            value,
            scale=self._scale,
            dropout_rate=self._dropout,
            training=training,
            seed_generator=self._dropout_layer.seed_generator if self._dropout > 0 else None,
            return_weights=return_attention_scores,
            implementation=kernel_name(self._flash_attention, self.implementation),
            hard=self._hard,
            # Keras's semantics for the keys `attention_mask` excludes; `call` zeroed the padded inputs already
            zero_unattended_keys=False,
            **options,
        )
        return attention if return_attention_scores else (attention, None)

    def _finish(self, query, attended, output_rows, weights, cache, return_attention_scores):
        """The gate and the output projection, zero at the rows `output_rows` marks `False` (padded
        queries, rows without any key: the projection's bias would be there); `output[, weights][, cache]`."""
        if self._use_gate:
            attended = attended * self._gate_dense(query)
        output = projections.output_projection(self, attended)  # (batch, query_len, output_dim)
        output = zero_padding(output, output_rows)
        return _results(output, weights, cache, return_attention_scores)

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
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

        This implementation runs `keras_attn.dispatch.attention.scaled_dot_product_attention` with the
        layer's `scale`, `hard`, dropout and `implementation` on rank-4 tensors, and on higher ranks
        too (`attention_axes` over several axes, or other axes than the sequence) with the attention
        axes flattened into one sequence (`keras_attn.layers.attention_axes`: Keras's semantics, its
        scores' layout). An `attention_bias` cannot reach an override (a `ValueError` says so).
        """
        if len(query.shape) == 4:
            mask = None if attention_mask is None else as_4d_mask(attention_mask)
            # A KerasHub decoder block's causal mask also passes the pattern, which it lies within:
            # the kernels skip what it hides, and the mask alone still says which rows have keys.
            is_causal = bool(use_causal_mask) or within_causal_pattern(attention_mask)
            attended, weights = self._attend(
                query, key, value, training, return_attention_scores, mask=mask, is_causal=is_causal
            )
            if self._rows_without_keys == "keras":  # a subclass's `call` (KerasHub's cache) kept by `convert`
                options = dict(mask=mask, is_causal=bool(use_causal_mask))
                attended = keras_compatibility.keras_rows(self, attended, value, options, return_attention_scores)
            return attended, weights
        if use_causal_mask:
            causal = self._compute_causal_mask(query, value)  # (1, query_len, key_len)
            attention_mask = (
                causal if attention_mask is None else ops.logical_and(ops.cast(attention_mask, "bool"), causal)
            )
        return attention_axes.flattened(
            lambda q, k, v, mask: self._attend(q, k, v, training, return_attention_scores, mask=mask),
            query,
            key,
            value,
            self._attention_axes,
            attention_mask,
            return_attention_scores,
        )

    def _masked_softmax(self, attention_scores, attention_mask=None):
        """Keras's masked softmax, then exact zeros at masked entries: a fully masked row is all zero."""
        weights = super()._masked_softmax(attention_scores, attention_mask)
        if attention_mask is None:
            return weights
        mask = ops.cast(attention_mask, "bool")
        mask = attention_axes.keras_expanded(mask, len(attention_scores.shape), len(self._attention_axes))
        return zero_masked(weights, mask)

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
        segment_ids=None,
        query_segment_ids=None,
        key_segment_ids=None,
    ):
        """Symbolic `output[, scores][, cache]`, as `call` returns them."""
        check_scores_allowed(self._flash_attention, return_attention_scores)
        value = query if value is None else value
        key_shape = None if key is None else key.shape
        # Keras's shape rule, also for subclasses whose `compute_output_shape` takes other arguments.
        output_shape = keras.layers.MultiHeadAttention.compute_output_shape(self, query.shape, value.shape, key_shape)
        weights = None
        if return_attention_scores:
            if len(query.shape) != 3:  # the scores' axes follow `attention_axes`: trace `call`
                return keras.Operation.compute_output_spec(
                    self,
                    query,
                    value,
                    key,
                    query_mask,
                    value_mask,
                    key_mask,
                    attention_mask,
                    True,
                    training,
                    use_causal_mask,
                )
            key_len = (
                value.shape[1]
                if cache is None
                else key_value_cache.key_length(self._sliding_window, cache, cache_update_index, query.shape[1])
            )
            weights = keras.KerasTensor((query.shape[0], self._num_heads, query.shape[1], key_len), self.compute_dtype)
        output = keras.KerasTensor(output_shape, self.compute_dtype)
        cache = None if cache is None else keras.KerasTensor(cache.shape, cache.dtype)
        return _results(output, weights, cache, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sliding_window": self._sliding_window,  # also where Keras (< 3.15) does not write them
                "use_gate": self._use_gate,
                "flash_attention": self._flash_attention,
                "num_key_value_heads": self._num_key_value_heads,
                "implementation": self.implementation,
                "scale": self._scale,
                "hard": self._hard,
                "attention_pattern": keras.saving.serialize_keras_object(self._attention_pattern),
                "position_bias": keras.saving.serialize_keras_object(self._position_bias),
                "rows_without_keys": self._rows_without_keys,
            }
        )
        return config


def _padding_zeroed(query, key, value, query_mask, key_positions, cache):
    """`query`, `key`, `value` with exact zeros at their padded positions, so that nothing they hold
    there reaches an output or a weight gradient (`zero_padding`): the query at `query_mask`'s padding,
    the key and value at `key_positions`' (without a cache: with one, the key masks cover the cache).

    A tensor passed in several roles stays one tensor (the fused QKV projection of self-attention
    needs it): it is zeroed where it is padding in every role, since a position real in one role holds
    real content (a real key in a padded query row still needs its key and value)."""
    if cache is not None:
        key_positions = None
    if query is value and key is value:
        same = zero_padding(query, either_mask(query_mask, key_positions))
        return same, same, same
    query = zero_padding(query, query_mask)
    if key is value:
        value = zero_padding(value, key_positions)
        return query, value, value
    return query, zero_padding(key, key_positions), zero_padding(value, key_positions)


def _results(output, weights, cache, return_attention_scores):
    """`output[, weights][, cache]`: what `call` returns."""
    results = (output,) + ((weights,) if return_attention_scores else ()) + (() if cache is None else (cache,))
    return results[0] if len(results) == 1 else results
