"""A linear layer on sparse inputs given as (feature ids, values) pairs."""

import keras
from keras import ops

from keras_attn.utils import checked_ids
from keras_attn.validation import check_positive_int
from models.serialization import register_serializable


@register_serializable()
class SparseLinear(keras.layers.Layer):
    """`Dense` on a sparse vector: `sum_i values[i] * kernel[features[i]] + bias`.

    The same numbers as a `Dense(units)` applied to the dense vector that scatters `values` at
    `features` (repeated ids add up), at the cost of the number of entries, not of `num_features`.

    Args:
        num_features: size of the sparse vector (rows of the kernel).
        units: output size.
        kernel_initializer, bias_initializer: as for `Dense`.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: a pair `(features, values)`: int `(batch, entries)` ids in `[0, num_features)`
            and float `(batch, entries)` values. An id out of range is a `ValueError` naming
            `features` eagerly and a run-time assertion in `tf.function` (none under XLA).

    Returns:
        `(batch, units)`.

    Example:

    >>> layer = SparseLinear(num_features=1000, units=1)
    >>> features = keras.ops.array([[3, 999, 3]], "int32")
    >>> values = keras.ops.array([[0.5, 1.0, 0.25]], "float32")
    >>> tuple(layer((features, values)).shape)
    (1, 1)
    """

    def __init__(self, num_features, units=1, kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        check_positive_int("num_features", num_features)
        check_positive_int("units", units)
        super().__init__(**kwargs)
        self.num_features = num_features
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        features_shape, values_shape = input_shape
        if len(features_shape) != 2 or tuple(features_shape) != tuple(values_shape):
            raise ValueError(
                "`features` and `values` must both have shape (batch, entries). Received: "
                f"features.shape={tuple(features_shape)}, values.shape={tuple(values_shape)}"
            )
        self.kernel = self.add_weight(
            shape=(self.num_features, self.units), initializer=self.kernel_initializer, name="kernel"
        )
        self.bias = self.add_weight(shape=(self.units,), initializer=self.bias_initializer, name="bias")

    def call(self, inputs):
        features, values = inputs
        features = checked_ids("features", features, self.num_features, "num_features")
        rows = ops.take(ops.cast(self.kernel, self.compute_dtype), features, axis=0)  # (batch, entries, units)
        values = ops.cast(values, self.compute_dtype)
        return ops.einsum("be,beu->bu", values, rows) + ops.cast(self.bias, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], self.units)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_features": self.num_features,
                "units": self.units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
