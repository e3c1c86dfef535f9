"""The base of the sub-quadratic self-attention layers: learned head projections around an attention rule.

`LinearAttention`, `LinformerSelfAttention` and `LSHSelfAttention` share everything but the rule that
mixes the heads' values: the query/key/value projections to `(batch, seq, heads, depth)`, the output
projection, the padding mask (explicit or the Keras mask of the inputs) and the config. A subclass
implements `_attend(query, key, value, mask, training)`; `shares_query_key = True` (Reformer) builds
no key projection and passes the query as the key.
"""

import keras
from keras import ops

from keras_attn.softmax import zero_masked
from keras_attn.utils import check_padding_mask
from keras_attn.validation import check_positive_int
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import clone_initializer
from keras_attn.utils import keras_mask
from keras_attn.validation import check_bool


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

    def build(self, inputs_shape):
        check_sequence_shape("inputs", inputs_shape)
        heads = (None, self.num_heads)
        self.query_dense = self._projection("query", "btf,fhd->bthd", heads + (self.key_dim,), "hd")
        self.query_dense.build(inputs_shape)
        if not self.shares_query_key:
            self.key_dense = self._projection("key", "btf,fhd->bthd", heads + (self.key_dim,), "hd")
            self.key_dense.build(inputs_shape)
        self.value_dense = self._projection("value", "btf,fhd->bthd", heads + (self.value_dim,), "hd")
        self.value_dense.build(inputs_shape)
        output_dim = self.output_dim or inputs_shape[-1]
        self.output_dense = self._projection("attention_output", "bthd,hdo->bto", (None, output_dim), "o")
        self.output_dense.build((None, None, self.num_heads, self.value_dim))

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

    def padding_mask(self, inputs, mask):
        """The boolean `(batch, seq)` padding mask: `mask`, else the Keras mask of `inputs`, else `None`."""
        mask = keras_mask(inputs) if mask is None else mask
        check_padding_mask("mask", mask, inputs.shape)
        return None if mask is None else ops.cast(mask, "bool")

    def call(self, inputs, mask=None, training=None):
        mask = self.padding_mask(inputs, mask)
        query, key, value = self.project(inputs, mask)
        attended = self._attend(query, key, value, mask, training)  # (batch, seq, heads, value_dim)
        return self.output_dense(ops.cast(attended, self.compute_dtype))

    def _attend(self, query, key, value, mask, training):
        """The attention rule: `(batch, seq, heads, value_dim)` from the projected heads and the padding mask."""
        raise NotImplementedError

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def compute_mask(self, inputs, mask=None):
        return mask

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
