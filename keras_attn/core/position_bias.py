"""Position biases: additive attention logits computed from query and key positions, block by block.

A position bias (ALiBi, T5's relative position bias) is a function of where a query and a key
sit, not of their content. It is never handed to a kernel as a `(batch, heads, L, L)` tensor:
every kernel asks it for the bias of the block it is computing, from that block's positions,
as it asks an attention pattern (`keras_attn.patterns`) for the block's mask. The protocol:

- `block_bias(parameters, query_positions, key_positions)`: the float32 bias
  `(1, heads, len(query_positions), len(key_positions))` of one block;
- `bias_parameters()`: the variables or tensors the bias depends on (a learned table; none for
  ALiBi), read once per call outside the kernels' custom gradients (`read_bias_parameters`)
  and handed back to `block_bias` as tensors,
  so those kernels can return their gradient (`bias_parameter_gradients`, a small
  vector-Jacobian product of each block's bias with its logits gradient).

Positions are absolute, as for patterns: query `i` of a call sits at `query_offset + i` among
the keys (cached decoding), key `j` at `j`. Calling the layer gives the bias of any positions,
`layer(query_positions, key_positions)`, in the compute dtype.
"""

import keras
import tensorflow as tf
from keras import ops

from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_positive_int


class PositionBias(keras.layers.Layer):
    """Base class of the position biases; subclasses implement `block_bias` (and `bias_parameters`).

    Args:
        num_heads: number of attention heads the bias is for (each head gets its own bias).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query_positions: int `(query_len,)` or `(batch, query_len)`, positions of the queries.
        key_positions: int `(key_len,)` or `(batch, key_len)`, positions of the keys.

    Returns:
        The bias `(batch or 1, heads, query_len, key_len)` in the compute dtype.
    """

    def __init__(self, num_heads, **kwargs):
        check_positive_int("num_heads", num_heads)
        super().__init__(**kwargs)
        self.num_heads = num_heads

    def build(self, query_positions_shape=None, key_positions_shape=None):
        """Creates the bias's weights (none by default); the shapes are not needed."""
        self.built = True

    def bias_parameters(self):
        """The variables or tensors `block_bias` depends on, as a tuple (empty by default)."""
        return ()

    def block_bias(self, parameters, query_positions, key_positions):
        """The bias `(batch or 1, heads, query_len, key_len)` of these positions, in `bias_dtype`.

        Args:
            parameters: the tuple `bias_parameters()` returned, or those values read as tensors.
            query_positions: int `(query_len,)` or `(batch, query_len)`.
            key_positions: int `(key_len,)` or `(batch, key_len)`.
        """
        raise NotImplementedError

    @property
    def bias_dtype(self):
        """The dtype of `block_bias`: float32, float64 for a float64 layer (never 16 bits)."""
        return float_math_dtype(self.compute_dtype)

    def call(self, query_positions, key_positions):
        for name, positions in (("query_positions", query_positions), ("key_positions", key_positions)):
            _check_positions(name, positions)
        batches = [positions.shape[0] for positions in (query_positions, key_positions) if len(positions.shape) == 2]
        if len(set(batches) - {None, 1}) > 1:  # a batch of 1 (or 1-D positions) is every row's
            raise ValueError(
                "`query_positions` and `key_positions` must have the same batch size (or 1). Received: "
                f"query_positions.shape={tuple(query_positions.shape)}, key_positions.shape={tuple(key_positions.shape)}"
            )
        return ops.cast(self.block_bias(self.bias_parameters(), query_positions, key_positions), self.compute_dtype)

    def compute_output_shape(self, query_positions_shape, key_positions_shape):
        batch = query_positions_shape[0] if len(query_positions_shape) == 2 else 1
        return (batch, self.num_heads, query_positions_shape[-1], key_positions_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads})
        return config


def _check_positions(name, positions):
    dtype = keras.backend.standardize_dtype(positions.dtype)
    if "int" not in dtype or len(positions.shape) not in (1, 2):
        raise ValueError(
            f"`{name}` must be an integer tensor `(length,)` or `(batch, length)`. "
            f"Received: {name}.shape={tuple(positions.shape)}, dtype={dtype}"
        )


def relative_positions(query_positions, key_positions):
    """`key - query`, int32 `(batch or 1, query_len, key_len)`, of 1-D or `(batch, len)` positions."""
    query_positions, key_positions = (_batched(ops.cast(p, "int32")) for p in (query_positions, key_positions))
    return ops.expand_dims(key_positions, 1) - ops.expand_dims(query_positions, 2)  # (batch | 1, q, k)


def _batched(positions):
    return ops.expand_dims(positions, 0) if len(positions.shape) == 1 else positions


def check_position_bias(position_bias, num_heads):
    """`position_bias` (a `PositionBias` or `None`), checked against the query heads; built."""
    if position_bias is None:
        return None
    if not isinstance(position_bias, PositionBias):
        raise TypeError(
            "`position_bias` must be a keras_attn.core.position_bias.PositionBias layer (e.g. keras_attn.ALiBi) "
            f"or None. Received: position_bias={position_bias!r}"
        )
    if num_heads is not None and position_bias.num_heads != num_heads:
        raise ValueError(
            f"`position_bias` is for {position_bias.num_heads} heads but the attention has {num_heads} query "
            f"heads. Received: position_bias.num_heads={position_bias.num_heads}"
        )
    if not position_bias.built:
        position_bias.build()
    return position_bias


def get(identifier):
    """A `PositionBias` from a layer, its serialised config or `None` (which stays `None`)."""
    if isinstance(identifier, dict):
        identifier = keras.saving.deserialize_keras_object(identifier)
    return check_position_bias(identifier, None)


def read_bias_parameters(position_bias):
    """The values of `position_bias.bias_parameters()` as tensors (`()` for `None`).

    Read outside a custom gradient, they enter it as inputs and get their gradient from it.
    """
    if position_bias is None:
        return ()
    return tuple(tf.convert_to_tensor(parameter) for parameter in position_bias.bias_parameters())


def split_inputs(inputs, has_bias):
    """A streaming kernel's flat custom-gradient inputs `(query, key, value[, bias], *bias
    parameters)` as `(query, key, value, bias or None, bias parameters)`."""
    query, key, value = inputs[:3]
    bias = inputs[3] if has_bias else None
    return query, key, value, bias, tuple(inputs[4 if has_bias else 3 :])


def block_positions(start, length):
    """int32 positions `start .. start + length - 1`; `start` an int or a scalar int tensor."""
    return tf.range(length, dtype="int32") + tf.cast(start, "int32")


def add_block_bias(logits, position_bias, parameters, query_positions, key_positions):
    """`logits (batch, heads, q, k)` plus the position bias of these positions (`None`: unchanged)."""
    if position_bias is None:
        return logits
    bias = position_bias.block_bias(parameters, query_positions, key_positions)  # (1, heads, q, k)
    return logits + tf.cast(bias, logits.dtype)


def bias_parameter_gradients(position_bias, parameters, query_positions, key_positions, logits_grad):
    """The gradients of `parameters` from one block's logits gradient `(batch, heads, q, k)`.

    A vector-Jacobian product of `block_bias` (the bias does not depend on the batch, so the
    logits gradient is summed over it first); dense tensors shaped like `parameters`.
    """
    if not parameters:
        return ()
    with tf.GradientTape() as tape:
        tape.watch(parameters)
        bias = position_bias.block_bias(parameters, query_positions, key_positions)  # (1, heads, q, k)
    summed = tf.cast(tf.reduce_sum(logits_grad, axis=0, keepdims=True), bias.dtype)  # (1, heads, q, k)
    grads = tape.gradient(bias, parameters, output_gradients=summed, unconnected_gradients="zero")
    return tuple(tf.convert_to_tensor(grad) for grad in grads)


def add_gradients(total, grads):
    """Element-wise sum of two tuples of parameter gradients (`total` may be empty: no parameters)."""
    return tuple(t + tf.cast(g, t.dtype) for t, g in zip(total, grads))
