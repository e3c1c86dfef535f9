"""The base of the sub-quadratic self-attention layers: learned head projections around an attention rule.

`LinearAttention`, `LinformerSelfAttention` and `LSHSelfAttention` share everything but the rule that
mixes the heads' values: the query/key/value projections to `(batch, seq, heads, depth)`, the output
projection, the padding mask (explicit or the Keras mask of the inputs), the call convention and the
config. A subclass implements `_attend(query, key, value, mask, training, causal, return_weights)`;
`shares_query_key = True` (Reformer) builds no key projection and passes the query as the key.

The call is Keras's (`keras_attn.MultiHeadAttention`'s): `layer(query, value=None, key=None, *,
query_mask=None, value_mask=None, key_mask=None, attention_mask=None, use_causal_mask=False,
return_attention_scores=False, training=None, cache=None)`, `cache` only for a family whose
capabilities declare one (it implements `_call_with_cache`). These families are self-attention only (`value` and
`key` are `None` or `query` itself; `capabilities.cross` is `False`), and they take one padding mask:
a position masked by any of `query_mask`, `value_mask`, `key_mask` (each the Keras mask of `query`
when not given) is padding, never attended and with a zero attention output. What else a family
takes is its `capabilities` (`keras_attn.layers.capabilities.AttentionCapabilities`).
"""

import keras
from keras import ops

from keras_attn.core.masks import merge_masks
from keras_attn.core.softmax import zero_masked
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

    def project(self, inputs, mask=None):
        """`(query, key, value)`, each `(batch, seq, heads, depth)`; the key is the query when shared.

        Padded positions (`mask` False) are projected from zeros: whatever they hold, NaN and inf
        included, never reaches a real position's output (`0 * NaN` in an attention sum is NaN).
        """
        if mask is not None:
            inputs = zero_masked(inputs, ops.expand_dims(mask, -1))  # (batch, seq, features)
        query = self.query_dense(inputs)  # (batch, seq, heads, key_dim)
        key = query if self.shares_query_key else self.key_dense(inputs)  # (batch, seq, heads, key_dim)
        return query, key, self.value_dense(inputs)  # value: (batch, seq, heads, value_dim)

    def padding_mask(self, query, query_mask=None, value_mask=None, key_mask=None):
        """The boolean `(batch, seq)` padding mask: the AND of the given masks, each the Keras mask of
        `query` when not given; `None` when there is none."""
        default = keras_mask(query)
        masks = [default if mask is None else mask for mask in (query_mask, value_mask, key_mask)]
        for name, mask in zip(("query_mask", "value_mask", "key_mask"), masks):
            check_padding_mask(name, mask, query.shape)
        return merge_masks(*(None if mask is None else ops.cast(mask, "bool") for mask in masks))

    def _checked_call(self, query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask):
        """`(padding mask, causal)` of a call, after refusing what the family's capabilities exclude."""
        check_call(self, query, value, key, attention_mask, use_causal_mask)
        causal = bool(use_causal_mask) or self.causal
        return self.padding_mask(query, query_mask, value_mask, key_mask), causal

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
        training=None,
        cache=None,
    ):
        mask, causal = self._checked_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
        )
        if cache is not None:
            if type(self).capabilities.cache is None:
                raise unsupported(self, "cache", f"cache={describe(cache)}")
            return self._call_with_cache(query, mask, causal, training, cache, return_attention_scores)
        projected = self.project(query, mask)
        attended, weights = self._attend(*projected, mask, training, causal, return_attention_scores)
        return self._finish(attended, weights, return_attention_scores)

    def _call_with_cache(self, query, mask, causal, training, cache, return_attention_scores):
        """`(output, new cache)` of an incremental decoding step; a family whose capabilities declare a cache implements it."""
        raise NotImplementedError

    def _finish(self, attended, weights, return_attention_scores):
        """The output projection of `attended` `(batch, seq, heads, value_dim)`; then the weights if asked."""
        output = self.output_dense(ops.cast(attended, self.compute_dtype))
        return (output, ops.cast(weights, self.compute_dtype)) if return_attention_scores else output

    def _attend(self, query, key, value, mask, training, causal, return_weights):
        """The attention rule: `(attended, weights or None)`.

        `attended` is `(batch, seq, heads, value_dim)` from the projected heads, the padding mask
        and whether this call is causal; `weights` (when `return_weights`) the attention weights
        `(batch, heads, seq, key_len)` with `output == weights @ values` per head.
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
