"""Fixed sinusoidal position encoding (Vaswani et al., 2017)."""

import keras
from keras import ops

from keras_attn.positions.token_positions import float_token_positions
from keras_attn.utils import as_float_inputs
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_number
from keras_attn.validation import check_positive_int

_MERGE_MODES = ("add", "concat")


def check_max_wavelength(max_wavelength):
    """Raises a `ValueError` unless `max_wavelength` is a finite number greater than 1."""
    check_number("max_wavelength", max_wavelength, above=1)


def inverse_frequencies(dim, max_wavelength, dtype="float32"):
    """`max_wavelength ** (-2i / dim)` for `i = 0 .. ceil(dim / 2) - 1`; `(ceil(dim / 2),)`."""
    exponents = ops.arange(0, dim, 2, dtype=dtype) / ops.cast(dim, dtype)  # (ceil(dim / 2),)
    return ops.power(ops.cast(max_wavelength, dtype), -exponents)


def sinusoids(token_positions, dim, max_wavelength=10000):
    """Encoding `(batch, length, dim)` of float positions `(batch, length)`: `sin` on even features, `cos` on odd ones.

    Feature `2i` of position `t` is `sin(t / max_wavelength ** (2i / dim))` and feature
    `2i + 1` is the matching `cos`; computed in the dtype of `token_positions`.
    """
    frequencies = inverse_frequencies(dim, max_wavelength, token_positions.dtype)  # (ceil(dim / 2),)
    angles = ops.einsum("bt,f->btf", token_positions, frequencies)  # (batch, length, ceil(dim / 2))
    pairs = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (batch, length, ceil(dim / 2), 2)
    batch, length = ops.shape(token_positions)[0], ops.shape(token_positions)[1]
    return ops.reshape(pairs, (batch, length, -1))[..., :dim]  # (batch, length, dim)


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding (Vaswani et al., 2017), for any sequence length.

    Position `t` is encoded as `sin(t / max_wavelength ** (2i / d))` on feature `2i` and
    `cos(...)` of the same angle on feature `2i + 1`. For every offset `k` the encoding of
    `t + k` is a fixed rotation of the encoding of `t`, which lets attention pick up relative
    positions. The encoding is computed on the fly in float32 (float64 for a float64 layer),
    with no maximum length and no weights, then cast to the compute dtype. The Keras mask of
    the inputs passes through.

    Args:
        merge_mode: `"add"` returns `inputs + encoding` (encoding width = input width);
            `"concat"` appends `encoding_dim` encoding features to the inputs.
        max_wavelength: the longest wavelength of the sinusoids, a number greater than 1.
        encoding_dim: the width of the encoding with `merge_mode="concat"`; defaults to the
            input width. With `"add"` it must be `None` or the input width.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`.
        start_index: int or scalar int tensor, the position of the first element of `inputs`
            (cached decoding feeds one position at a time).
        positions: optional int `(batch, seq)`, the position (>= 0) of every element instead.
        segment_ids: optional int `(batch, seq)` documents of a packed row (0 for padding):
            positions restart at 0 in each document (`keras_attn.document_positions`), so each
            document is encoded as it is alone. At most one of `start_index` (non-zero),
            `positions` and `segment_ids` (`keras_attn.positions.token_positions`).

    Returns:
        `(batch, seq, features)` with `"add"`, `(batch, seq, features + encoding_dim)` with
        `"concat"`.

    Example:

    >>> x = keras.random.normal((2, 7, 16))
    >>> tuple(SinusoidalPositionEncoding()(x).shape)
    (2, 7, 16)
    >>> tuple(SinusoidalPositionEncoding(merge_mode="concat", encoding_dim=4)(x).shape)
    (2, 7, 20)
    """

    def __init__(self, merge_mode="add", max_wavelength=10000, encoding_dim=None, **kwargs):
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"`merge_mode` must be one of {_MERGE_MODES}. Received: merge_mode={merge_mode!r}")
        check_max_wavelength(max_wavelength)
        check_positive_int("encoding_dim", encoding_dim, allow_none=True)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.merge_mode = merge_mode
        self.max_wavelength = max_wavelength
        self.encoding_dim = encoding_dim

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have rank 3 (batch, seq, features) with a known feature size. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.input_spec = keras.layers.InputSpec(ndim=3, name="inputs")  # checked at every call, not only the first
        self._check_width(inputs_shape[-1])

    def _check_width(self, features):
        if self.merge_mode == "add" and self.encoding_dim not in (None, features):
            raise ValueError(
                "With merge_mode='add' the encoding has the input width: `encoding_dim` must be None "
                f"or {features}. Received: encoding_dim={self.encoding_dim}"
            )

    def _encoding_width(self, features):
        return self.encoding_dim or features

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        self._check_width(inputs.shape[-1])  # a built layer is called on other widths too
        inputs = as_float_inputs(inputs, self.compute_dtype)  # ints and booleans, as Keras's layers take them
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        width = self._encoding_width(inputs.shape[-1])
        at = float_token_positions(
            inputs, float_math_dtype(self.compute_dtype), start_index, positions, segment_ids
        )  # (1 | batch, seq)
        encoding = ops.cast(sinusoids(at, width, self.max_wavelength), self.compute_dtype)  # (1 | batch, seq, width)
        if self.merge_mode == "add":
            return inputs + encoding
        encoding = ops.broadcast_to(encoding, (batch, length, width))  # (batch, seq, width)
        return ops.concatenate([inputs, encoding], axis=-1)

    def compute_output_shape(self, inputs_shape):
        if self.merge_mode == "add":
            return tuple(inputs_shape)
        return (*inputs_shape[:-1], inputs_shape[-1] + self._encoding_width(inputs_shape[-1]))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "merge_mode": self.merge_mode,
                "max_wavelength": self.max_wavelength,
                "encoding_dim": self.encoding_dim,
            }
        )
        return config
