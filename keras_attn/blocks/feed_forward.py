"""Position-wise feed-forward block of a Transformer."""

import keras

from keras_attn.utils import clone_initializer
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward block: `Dense -> activation -> dropout -> Dense`.

    Applied to every position independently (Vaswani et al., 2017). The Keras mask of the
    inputs passes through.

    Args:
        intermediate_dim: width of the hidden layer.
        activation: activation of the hidden layer (name or callable).
        dropout: dropout rate applied to the hidden activations when training.
        output_dim: width of the output; defaults to the input width.
        kernel_initializer: initializer of both kernels.
        bias_initializer: initializer of both biases.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, ..., features)`.
        training: whether dropout is active.

    Returns:
        `(batch, ..., output_dim)`.

    Example:

    >>> x = keras.random.normal((2, 7, 16))
    >>> tuple(FeedForward(intermediate_dim=64, activation="gelu")(x).shape)
    (2, 7, 16)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        check_positive_int("intermediate_dim", intermediate_dim)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_rate("dropout", dropout)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.intermediate_dim = intermediate_dim
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _dense(self, units, name, activation=None):
        return keras.layers.Dense(
            units,
            activation=activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        if len(inputs_shape) < 2 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have rank >= 2 (batch, ..., features) with a known feature size. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        features = inputs_shape[-1]
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: features}, name="inputs")  # at every call
        check_elements("The intermediate kernel", features=features, intermediate_dim=self.intermediate_dim)
        check_elements(
            "The output kernel", intermediate_dim=self.intermediate_dim, output_dim=self.output_dim or features
        )
        self.intermediate_dense = self._dense(self.intermediate_dim, "intermediate_dense", self.activation)
        self.intermediate_dense.build(inputs_shape)
        self.intermediate_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.output_dense = self._dense(self.output_dim or inputs_shape[-1], "output_dense")
        self.output_dense.build((*inputs_shape[:-1], self.intermediate_dim))

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)  # (batch, ..., intermediate_dim)
        hidden = self.intermediate_dropout(hidden, training=training)
        return self.output_dense(hidden)  # (batch, ..., output_dim)

    def compute_output_shape(self, inputs_shape):
        return (*inputs_shape[:-1], self.output_dim or inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
