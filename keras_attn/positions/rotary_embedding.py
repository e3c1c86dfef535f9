"""Rotary position embedding (RoPE, Su et al., 2021)."""

import keras
from keras import ops

from keras_attn.positions.sinusoidal_position_encoding import check_max_wavelength
from keras_attn.positions.sinusoidal_position_encoding import inverse_frequencies
from keras_attn.positions.token_positions import float_token_positions
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_number


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE): rotates query/key features by position-dependent angles.

    Feature `i` and feature `i + depth / 2` of the token at position `t` form a pair rotated by
    the angle `(t / scaling_factor) / max_wavelength ** (2i / depth)` (the "rotate half"
    convention of KerasHub and Llama). Applied to queries and keys, the dot product
    `q_m . k_n` then depends on the positions only through `m - n`. The rotation is computed
    in float32 (float64 for a float64 layer) and cast back to the compute dtype. No weights.

    Args:
        max_wavelength: the longest wavelength of the rotations, a number greater than 1.
        scaling_factor: positive number dividing the positions (linear position
            interpolation to stretch a trained context).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, heads, depth)` with an even `depth` (projected queries or keys).
        start_index: int or scalar int tensor, the position of the first element of `inputs`
            (cached decoding feeds one position at a time).
        positions: optional int `(batch, seq)`, the position (>= 0) of every element instead.
        segment_ids: optional int `(batch, seq)` documents of a packed row (0 for padding):
            positions restart at 0 in each document (`keras_attn.document_positions`); the
            rotation only changes the logits by relative position, but this keeps each document's
            rotated queries and keys exactly those of the document alone. At most one of
            `start_index` (non-zero), `positions` and `segment_ids`
            (`keras_attn.positions.token_positions`).

    Returns:
        The rotated `inputs`, same shape and dtype.

    Example:

    >>> query = keras.random.normal((2, 10, 4, 16))
    >>> tuple(RotaryEmbedding()(query, start_index=5).shape)
    (2, 10, 4, 16)
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, **kwargs):
        check_max_wavelength(max_wavelength)
        check_number("scaling_factor", scaling_factor, above=0)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor

    def build(self, inputs_shape):
        if len(inputs_shape) != 4 or inputs_shape[-1] is None or inputs_shape[-1] % 2:
            raise ValueError(
                "`inputs` must have rank 4 (batch, seq, heads, depth) with a known, even depth. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.input_spec = keras.layers.InputSpec(ndim=4, name="inputs")  # checked at every call, not only the first

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        dtype = float_math_dtype(self.compute_dtype)
        at = float_token_positions(inputs, dtype, start_index, positions, segment_ids)  # (1 | batch, seq)
        angles = ops.einsum(
            "bt,f->btf", at / self.scaling_factor, inverse_frequencies(inputs.shape[-1], self.max_wavelength, dtype)
        )  # (1 | batch, seq, depth / 2)
        angles = ops.concatenate([angles, angles], axis=-1)[:, :, None, :]  # (1 | batch, seq, 1, depth)
        inputs = ops.cast(inputs, dtype)
        first, second = ops.split(inputs, 2, axis=-1)  # (batch, seq, heads, depth / 2)
        rotated_half = ops.concatenate([-second, first], axis=-1)  # (batch, seq, heads, depth)
        rotated = inputs * ops.cos(angles) + rotated_half * ops.sin(angles)
        return ops.cast(rotated, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength, "scaling_factor": self.scaling_factor})
        return config
