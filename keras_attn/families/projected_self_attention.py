"""The base of the sub-quadratic self-attention layers: learned head projections around an attention rule.

`LinearAttention`, `LinformerSelfAttention` and `LSHSelfAttention` share everything but the rule that
mixes the heads' values: the query/key/value projections to `(batch, seq, heads, depth)`, the output
projection, the padding mask (explicit or the Keras mask of the inputs), the call convention and the
config. A subclass implements `_attend(query, key, value, mask, training, causal, return_weights)`;
`shares_query_key = True` (Reformer) builds no key projection and passes the query as the key.

The call is Keras's (`keras_attn.MultiHeadAttention`'s): `layer(query, value=None, key=None, *,
query_mask=None, value_mask=None, key_mask=None, attention_mask=None, use_causal_mask=False,
return_attention_scores=False, segment_ids=None, training=None, cache=None)`, `cache` only for a family
whose capabilities declare one (it implements `_call_with_cache`), `segment_ids` (a packed row, int
`(batch, seq)`, 0 for padding: `keras_attn.core.segments`) only for one that declares `segments`. These families are self-attention only (`value` and
`key` are `None` or `query` itself; `capabilities.cross` is `False`). Their padding masks mean what
they mean in Keras and in `keras_attn.MultiHeadAttention` (each the Keras mask of `query` when not
given): `query_mask` marks the real query positions (a `False` one outputs exactly zero), `value_mask`
and `key_mask` the real keys (a position either marks `False` is never attended). A query row without
any key outputs zero too. Padded positions are zeroed by selection before the projections, so
whatever they hold (NaN, inf) reaches neither a real output nor a weight gradient. What else a family
takes is its `capabilities` (`keras_attn.layers.capabilities.AttentionCapabilities`).
"""

import keras
from keras import ops

from keras_attn.core.masks import either_mask
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import zero_masked
from keras_attn.core.masks import zero_padding
from keras_attn.core.segments import resolve_segment_ids
from keras_attn.families.document_runs import document_bounds
from keras_attn.layers.capabilities import check_call
from keras_attn.layers.capabilities import describe
from keras_attn.layers.capabilities import unsupported
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import clone_initializer
from keras_attn.utils import keras_mask
from keras_attn.validation import check_bool
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_projection_sizes


class ProjectedSelfAttention(keras.layers.Layer):
    """Multi-head self-attention whose attention rule is the subclass hook `_attend`.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        value_dim: size of each head for value; defaults to `key_dim`.
        output_dim: size of the output's last axis; defaults to the input's feature size.
        use_bias: whether the projections use bias vectors.
        kernel_initializer, bias_initializer: as for `Dense`.
        seed: seed of the layer's random draws (random features, rotations); `None` draws one.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).
    """

    shares_query_key = False
    causal = False  # a family constructed causal (`causal=True`) is causal on every call

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_bool("use_bias", use_bias)
        check_projection_sizes(num_heads, key_dim, value_dim or key_dim)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _projection(self, name, equation, output_shape, bias_axes):
        projection = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # Per-position projections keep the padding mask valid; this layer reads it itself.
        projection.supports_masking = True
        return projection

    def build(self, query_shape, value_shape=None, key_shape=None):
        """Builds the projections from `query_shape` (`value_shape` / `key_shape`, when Keras passes them
        for a `layer(x, x)` call, are the same sequence's)."""
        check_sequence_shape("query", query_shape)
        check_projection_sizes(self.num_heads, self.key_dim, self.value_dim, query_shape[-1], self.output_dim)
        heads = (None, self.num_heads)
        self.query_dense = self._projection("query", "btf,fhd->bthd", heads + (self.key_dim,), "hd")
        self.query_dense.build(query_shape)
        if not self.shares_query_key:
            self.key_dense = self._projection("key", "btf,fhd->bthd", heads + (self.key_dim,), "hd")
            self.key_dense.build(query_shape)
        self.value_dense = self._projection("value", "btf,fhd->bthd", heads + (self.value_dim,), "hd")
        self.value_dense.build(query_shape)
        output_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._projection("attention_output", "bthd,hdo->bto", (None, output_dim), "o")
        self.output_dense.build((None, None, self.num_heads, self.value_dim))
        self._build_rule(query_shape)

    def _build_rule(self, query_shape):
        """The attention rule's own weights (rotations, length projections, random features); none here."""

    def project(self, inputs, query_mask=None, key_mask=None):
        """`(query, key, value)`, each `(batch, seq, heads, depth)`; the key is the query when shared.

        The query is projected from inputs zero where `query_mask` is `False`, the key and value from
        inputs zero where `key_mask` is (`zero_padding`): whatever a padded position holds, NaN and inf
        included, reaches neither a real output nor a gradient (`0 * NaN` in an attention sum is NaN).
        A shared query/key projection zeroes only the positions padded in both roles.
        """
        keys = zero_padding(inputs, key_mask)  # (batch, seq, features)
        if self.shares_query_key:
            queries = zero_padding(inputs, either_mask(query_mask, key_mask))
        else:
            queries = keys if query_mask is key_mask else zero_padding(inputs, query_mask)
        query = self.query_dense(queries)  # (batch, seq, heads, key_dim)
        key = query if self.shares_query_key else self.key_dense(keys)  # (batch, seq, heads, key_dim)
        return query, key, self.value_dense(keys)  # value: (batch, seq, heads, value_dim)

    def padding_masks(self, query, query_mask=None, value_mask=None, key_mask=None):
        """`(query_mask, key_mask)`, boolean `(batch, seq)` or `None`: the real queries, and the real keys (the
        AND of `value_mask` and `key_mask`), each given mask the Keras mask of `query` when not given."""
        default = keras_mask(query)
        masks = [default if mask is None else mask for mask in (query_mask, value_mask, key_mask)]
        for name, mask in zip(("query_mask", "value_mask", "key_mask"), masks):
            check_padding_mask(name, mask, query.shape)
        query_mask, value_mask, key_mask = (None if mask is None else ops.cast(mask, "bool") for mask in masks)
        return query_mask, merge_masks(value_mask, key_mask)

    def _checked_call(
        self, query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask, segment_ids
    ):
        """`(query_mask, key_mask, causal, segment_ids)` of a call, after refusing what the family's capabilities
        exclude: the padding masks also `False` at segment 0, the ids int32 `(batch, seq)` or `None`."""
        check_call(self, query, value, key, attention_mask, use_causal_mask, segment_ids=segment_ids)
        causal = bool(use_causal_mask) or self.causal
        query_mask, key_mask = self.padding_masks(query, query_mask, value_mask, key_mask)
        # Hashing (LSH) and the running sums (linear) read each document as a span of the row.
        segment_ids, _ = resolve_segment_ids(
            segment_ids, None, None, query.shape[1], query.shape[1], query.shape[0], runs=True
        )
        if segment_ids is not None:
            in_document = ops.not_equal(segment_ids, 0)  # (batch, seq)
            query_mask, key_mask = merge_masks(query_mask, in_document), merge_masks(key_mask, in_document)
        return query_mask, key_mask, causal, segment_ids

    def call(
        self,
        query,
        value=None,
        key=None,
        *,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        segment_ids=None,
        training=None,
        cache=None,
    ):
        query_mask, key_mask, causal, segment_ids = self._checked_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask, segment_ids
        )
        if cache is not None:
            if type(self).capabilities.cache is None:
                raise unsupported(self, "cache", f"cache={describe(cache)}")
            return self._call_with_cache(
                query, query_mask, key_mask, causal, training, cache, return_attention_scores, segment_ids
            )
        projected = self.project(query, query_mask, key_mask)
        attended, weights = self._attend(*projected, key_mask, training, causal, return_attention_scores, segment_ids)
        output_rows = _rows_with_keys(query_mask, key_mask, causal, segment_ids)
        return self._finish(attended, weights, output_rows, return_attention_scores)

    def _call_with_cache(
        self, query, query_mask, key_mask, causal, training, cache, return_attention_scores, segment_ids
    ):
        """`(output, new cache)` of an incremental decoding step; a family whose capabilities declare a cache implements it."""
        raise NotImplementedError

    def _finish(self, attended, weights, output_rows, return_attention_scores):
        """The output projection of `attended` `(batch, seq, heads, value_dim)`, exactly zero (bias
        included) at the rows `output_rows` `(batch, seq)` marks `False`; then the weights, zero there too,
        if asked."""
        output = zero_padding(self.output_dense(ops.cast(attended, self.compute_dtype)), output_rows)
        if not return_attention_scores:
            return output
        weights = ops.cast(weights, self.compute_dtype)  # (batch, heads, seq, key_len)
        if output_rows is not None:
            weights = zero_masked(weights, ops.cast(output_rows, "bool")[:, None, :, None])
        return output, weights

    def _attend(self, query, key, value, key_mask, training, causal, return_weights, segment_ids):
        """The attention rule: `(attended, weights or None)`.

        `attended` is `(batch, seq, heads, value_dim)` from the projected heads, the key padding mask
        `key_mask` (`(batch, seq)`, `False` keys never attended; `None`: every key real), whether this
        call is causal and the int32 `segment_ids` `(batch, seq)` of a packed row (`None`: one document;
        only for a family declaring `segments`, each query attending within its own document); `weights` (when `return_weights`) the attention weights `(batch, heads, seq, key_len)`
        with `output == weights @ values` per head. The padded query rows are zeroed after the rule.
        """
        raise NotImplementedError

    def scores_key_length(self, query_shape):
        """The key axis of the attention scores for a `query_shape` input: its length (Linformer: projected)."""
        return query_shape[1]

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(self, query, value=None, key=None, return_attention_scores=False, cache=None, **unused):
        """Symbolic `output[, scores][, cache]`, as `call` returns them."""
        results = (keras.KerasTensor(self.compute_output_shape(query.shape), self.compute_dtype),)
        if return_attention_scores:
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], self.scores_key_length(query.shape))
            results += (keras.KerasTensor(scores_shape, self.compute_dtype),)
        if cache is not None:
            results += (tuple(keras.KerasTensor(part.shape, part.dtype) for part in cache),)
        return results[0] if len(results) == 1 else results

    def compute_mask(self, query, previous_mask=None):
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            output_dim=self.output_dim,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            seed=self.seed,
        )
        return config


def _rows_with_keys(query_mask, key_mask, causal, segment_ids=None):
    """`(batch, seq or 1)`: the real query rows that see a real key (every key before them when `causal`, of
    their own document with `segment_ids`); `None` when every row does."""
    if key_mask is None:
        return query_mask
    if segment_ids is not None:  # the real keys in the row's document (up to the row when causal), by prefix counts
        counts = ops.cumsum(ops.cast(key_mask, "int32"), axis=1)  # (batch, seq), keys at or before each index
        start, end = document_bounds(segment_ids)
        before_start = ops.take_along_axis(counts, start, axis=1) - ops.take_along_axis(
            ops.cast(key_mask, "int32"), start, axis=1
        )
        through = counts if causal else ops.take_along_axis(counts, end, axis=1)
        return merge_masks(query_mask, through > before_start)
    if causal:  # row i sees keys 0..i
        has_keys = ops.cumsum(ops.cast(key_mask, "int32"), axis=1) > 0  # (batch, seq)
    else:
        has_keys = ops.any(key_mask, axis=1, keepdims=True)  # (batch, 1)
    return merge_masks(query_mask, has_keys)
