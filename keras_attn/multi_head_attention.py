"""Multi-head attention, call-compatible with `keras.layers.MultiHeadAttention`."""

import keras
from keras import ops

from keras_attn.attention import ATTENTION_IMPLEMENTATIONS
from keras_attn.attention import scaled_dot_product_attention
from keras_attn.masks import merge_masks
from keras_attn.masks import padding_mask_to_attention_mask
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_positive_int
from keras_attn.utils import check_rate
from keras_attn.utils import clone_initializer

_SEQUENCE_AXES = (None, 1, (1,), [1], (-2,), [-2])


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (Vaswani et al., 2017) with exact masking on every path.

    A drop-in replacement for `keras.layers.MultiHeadAttention` on `(batch, seq, features)`
    inputs: the same constructor arguments, the same `call` signature and the same weight
    shapes (weights copy across with `set_weights`). On top of it:

    - a query row whose keys are all masked yields all-zero attention weights (Keras gives
      uniform weights on some paths); softmax always runs in float32;
    - one fused QKV matmul when `query`, `key` and `value` are the same tensor;
    - `num_key_value_heads` for grouped-query (and, with 1, multi-query) attention;
    - an additive `attention_bias` call argument (relative positions, ALiBi);
    - explicit `query_mask` / `value_mask` / `key_mask` arguments are always honoured,
      Keras masks (`Embedding(mask_zero=True)` upstream) are used when they are not given.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        value_dim: size of each head for value; defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections use bias vectors.
        output_shape: size of the output's last axis (int or 1-tuple); defaults to the
            query's feature size.
        attention_axes: only the sequence axis is supported (`None` or `1`).
        sliding_window: optional positive int; each query attends to keys with
            `|i - j| < sliding_window` (local/band attention).
        flash_attention: accepted for compatibility with Keras; ignored.
        kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
        activity_regularizer, kernel_constraint, bias_constraint: as for `Dense`.
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
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, query_len, query_features)`.
        value: `(batch, key_len, value_features)`.
        key: optional `(batch, key_len, key_features)`; defaults to `value`.
        query_mask: optional boolean `(batch, query_len)`; `False` rows get zero attention.
        value_mask: optional boolean `(batch, key_len)`; `False` keys are never attended.
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
        cache_update_index: int or scalar int tensor, the position of the first new token.

    Returns:
        `(batch, query_len, output_features)`; then the attention weights when
        `return_attention_scores=True`; then the updated cache when `cache` is given.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 64, mask_zero=True)(tokens)
    >>> x = MultiHeadAttention(num_heads=4, key_dim=16)(x, x, use_causal_mask=True)
    >>> model = keras.Model(tokens, x)
    """

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
        **kwargs,
    ):
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("sliding_window", sliding_window, allow_none=True)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
            )
        if implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"`implementation` must be one of {ATTENTION_IMPLEMENTATIONS}. "
                f"Received: implementation={implementation!r}"
            )
        check_rate("dropout", dropout)
        if attention_axes not in _SEQUENCE_AXES:
            raise ValueError(
                "keras_attn attends over the sequence axis of (batch, seq, features) inputs only: "
                f"`attention_axes` must be None or 1. Received: attention_axes={attention_axes}"
            )
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.supports_masking = True
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.num_key_value_heads = num_key_value_heads or num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.use_gate = use_gate
        self.output_shape_ = _normalize_output_shape(output_shape)
        self.sliding_window = sliding_window
        self.flash_attention = flash_attention
        self.implementation = implementation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if dropout > 0 else None

    def _projection(self, name, heads, head_dim, activation=None):
        initializer_config = dict(
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
        )
        projection = keras.layers.EinsumDense(
            "abc,cde->abde",
            output_shape=(None, heads, head_dim),
            bias_axes="de" if self.use_bias else None,
            activation=activation,
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
            **initializer_config,
        )
        # A per-position projection keeps a padding mask valid; this layer reads the masks
        # from its `*_mask` arguments, so the projections only need not to drop (and warn).
        projection.supports_masking = True
        return projection

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) != 3:
                raise ValueError(
                    f"`{name}` must have rank 3 (batch, seq, features). "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        if key_shape[1] is not None and value_shape[1] is not None and key_shape[1] != value_shape[1]:
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )
        self.query_dense = self._projection("query", self.num_heads, self.key_dim)
        self.query_dense.build(query_shape)
        self.key_dense = self._projection("key", self.num_key_value_heads, self.key_dim)
        self.key_dense.build(key_shape)
        # The gate is built before the value projection: Keras's weight order for `set_weights`.
        if self.use_gate:
            self.gate_dense = self._projection(
                "gate", self.num_heads, self.value_dim, activation="sigmoid"
            )
            self.gate_dense.build(query_shape)
        self.value_dense = self._projection("value", self.num_key_value_heads, self.value_dim)
        self.value_dense.build(value_shape)
        output_dim = self.output_shape_[0] if self.output_shape_ else query_shape[-1]
        self.output_dense = keras.layers.EinsumDense(
            "abcd,cde->abe",
            output_shape=(None, output_dim),
            bias_axes="e" if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((None, None, self.num_heads, self.value_dim))

    def _fused_qkv(self, inputs):
        """One matmul for the query, key and value projections of the same tensor."""
        projections = (self.query_dense, self.key_dense, self.value_dense)
        kernel = ops.concatenate(
            [ops.reshape(p.kernel, (ops.shape(p.kernel)[0], -1)) for p in projections], axis=-1
        )  # (features, (heads + 2 * kv_heads) * head_dim)
        bias = ops.concatenate([ops.reshape(p.bias, (-1,)) for p in projections], axis=0) if self.use_bias else None
        fused = self._affine(inputs, kernel, bias)  # (batch, seq, fused)
        sizes = [
            self.num_heads * self.key_dim,
            self.num_key_value_heads * self.key_dim,
            self.num_key_value_heads * self.value_dim,
        ]
        query, key, value = ops.split(fused, [sizes[0], sizes[0] + sizes[1]], axis=-1)
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        query = ops.reshape(query, (batch, length, self.num_heads, self.key_dim))
        key = ops.reshape(key, (batch, length, self.num_key_value_heads, self.key_dim))
        value = ops.reshape(value, (batch, length, self.num_key_value_heads, self.value_dim))
        return query, key, value

    def _output_projection(self, attended):
        """`output_dense` as one 2-D matmul: `(batch, query_len, heads, value_dim)` -> `(batch, query_len, output_dim)`.

        The same weights and result as calling the `EinsumDense`, which lowers `abcd,cde->abe` to
        a batched matmul whose kernel gradient is computed per batch element and then summed.
        """
        kernel = self.output_dense.kernel  # (heads, value_dim, output_dim)
        width = self.num_heads * self.value_dim
        batch, length = ops.shape(attended)[0], ops.shape(attended)[1]
        attended = ops.reshape(attended, (batch, length, width))  # (batch, query_len, heads * value_dim)
        bias = self.output_dense.bias if self.use_bias else None
        return self._affine(attended, ops.reshape(kernel, (width, -1)), bias)  # (batch, query_len, output_dim)

    def _affine(self, inputs, kernel, bias):
        """`inputs (..., in) @ kernel (in, out) + bias (out,)` in the compute dtype, as 2-D matmuls.

        `ops.add` of a vector is a `BiasAdd` on TensorFlow, whose gradient is a fast reduction
        (`+` gives an `AddV2` reduced by a slow column sum).
        """
        outputs = ops.matmul(inputs, ops.cast(kernel, self.compute_dtype))
        if bias is not None:
            outputs = ops.add(outputs, ops.cast(bias, self.compute_dtype))
        return outputs

    def _project(self, query, key, value):
        if query is value and key is value:
            return self._fused_qkv(query)
        return self.query_dense(query), self.key_dense(key), self.value_dense(value)

    def call(
        self,
        query,
        value,
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
        if key is None:
            key = value
        if cache_update_index is not None and query_mask is not None:
            query_mask = _query_rows(query_mask, query, cache_update_index)
        mask = self._attention_mask(query_mask, value_mask, key_mask, attention_mask)
        if cache is None:
            if cache_update_index is not None:
                raise ValueError(
                    "`cache_update_index` needs a `cache`. Received: cache=None, "
                    f"cache_update_index={cache_update_index}"
                )
            projected_query, projected_key, projected_value = self._project(query, key, value)
        else:
            projected_query, projected_key, projected_value, cache = self._update_cache(
                cache, query, key, value, cache_update_index
            )
        _check_mask_shapes(
            projected_query,
            projected_key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
        )
        # (batch, query_len, heads, value_dim)[, (batch, heads, query_len, key_len)]
        attention = scaled_dot_product_attention(
            projected_query,
            projected_key,
            projected_value,
            mask=mask,
            bias=attention_bias,
            is_causal=use_causal_mask,
            sliding_window=self.sliding_window,
            query_offset=0 if cache_update_index is None else cache_update_index,
            dropout_rate=self.dropout,
            training=training,
            seed_generator=self.seed_generator,
            return_weights=return_attention_scores,
            implementation=self.implementation,
        )
        attended, weights = attention if return_attention_scores else (attention, None)
        if self.use_gate:
            attended = attended * self.gate_dense(query)
        output = self._output_projection(attended)  # (batch, query_len, output_dim)
        results = (output,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

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
        if cache_update_index is None:
            projected_query = self.query_dense(query)
        else:
            projected_query, new_key, new_value = self._project(query, key, value)
            new_entries = ops.stack((new_key, new_value), axis=1)  # (batch, 2, query_len, kv_heads, dim)
            # One write of the new tokens into the cache; it is never re-assembled from K and V.
            cache = ops.slice_update(cache, (0, 0, cache_update_index, 0, 0), ops.cast(new_entries, cache.dtype))
        return projected_query, cache[:, 0], cache[:, 1], cache  # keys, values: (batch, max_len, kv_heads, dim)

    def _attention_mask(self, query_mask, value_mask, key_mask, attention_mask):
        """Merges padding masks and an explicit mask into one 4-D boolean mask (or `None`)."""
        if attention_mask is not None:
            rank = len(attention_mask.shape)
            if rank not in (2, 3, 4):
                raise ValueError(
                    "`attention_mask` must have rank 2 (query_len, key_len), 3 (batch, query_len, "
                    "key_len) or 4 (batch, heads, query_len, key_len). "
                    f"Received: attention_mask.shape={tuple(attention_mask.shape)}"
                )
            if rank == 2:
                attention_mask = ops.expand_dims(attention_mask, 0)  # (1, q, k)
            if rank in (2, 3):
                attention_mask = ops.expand_dims(attention_mask, 1)  # (batch, 1, q, k)
        for name, padding in (("query_mask", query_mask), ("value_mask", value_mask), ("key_mask", key_mask)):
            check_padding_mask(name, padding)
        return merge_masks(
            padding_mask_to_attention_mask(query_mask, None),
            padding_mask_to_attention_mask(None, merge_masks(value_mask, key_mask)),
            attention_mask,
        )

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        output_dim = self.output_shape_[0] if self.output_shape_ else query_shape[-1]
        return (*query_shape[:-1], output_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self.output_shape_,
                "sliding_window": self.sliding_window,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "use_gate": self.use_gate,
                "seed": self.seed,
                "num_key_value_heads": self.num_key_value_heads,
                "implementation": self.implementation,
            }
        )
        return config


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


def _check_mask_shapes(projected_query, projected_key, **tensors):
    """ValueError naming the mask/bias argument whose shape does not fit the query and key."""
    batch, query_len, heads = projected_query.shape[:3]
    key_len = projected_key.shape[1]
    targets = {
        "query_mask": [(batch, query_len)],
        "value_mask": [(batch, key_len)],
        "key_mask": [(batch, key_len)],
        "attention_mask": [
            (query_len, key_len),
            (batch, query_len, key_len),
            (batch, heads, query_len, key_len),
        ],
        "attention_bias": [(batch, heads, query_len, key_len)],
    }
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        shape = tuple(tensor.shape)
        if not any(_broadcastable(shape, target) for target in targets[name]):
            raise ValueError(
                f"`{name}` must be broadcastable to {' or '.join(map(str, targets[name]))}. "
                f"Received: {name}.shape={shape}"
            )


def _broadcastable(shape, target):
    return len(shape) == len(target) and all(
        received in (None, 1) or expected in (None, received) for received, expected in zip(shape, target)
    )


def _normalize_output_shape(output_shape):
    if output_shape is None:
        return None
    shape = (output_shape,) if isinstance(output_shape, int) else tuple(output_shape)
    if len(shape) != 1 or not isinstance(shape[0], int) or shape[0] <= 0:
        raise ValueError(
            "`output_shape` must be a positive int or a 1-tuple of one. "
            f"Received: output_shape={output_shape!r}"
        )
    return shape
