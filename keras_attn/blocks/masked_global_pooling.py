"""Global pooling over the real (unmasked) positions of a sequence."""

import keras
import numpy as np
from keras import ops

_MODES = ("mean", "max")


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedGlobalPooling(keras.layers.Layer):
    """Mean or max over the sequence axis, counting only positions the mask keeps.

    `keras.layers.GlobalAveragePooling1D` divides by the number of real tokens too, but a
    sequence with no real token gives `0 / 0`; `GlobalMaxPooling1D` ignores the mask. Here
    padding never takes part: the mean divides by the number of real positions, the max takes
    the largest value among real positions, and a sequence whose positions are all masked
    pools to exact zeros (never NaN or `-inf`). Sums run in float32 (float64 for float64 inputs).

    Args:
        mode: `"mean"` or `"max"`.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`.
        mask: optional boolean `(batch, seq)`, `True` for real positions. Taken from the Keras
            mask of the inputs (`Embedding(mask_zero=True)` upstream) when not given; without
            any mask every position counts.

    Returns:
        `(batch, features)` in the compute dtype. The output carries no mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 16, mask_zero=True)(tokens)
    >>> pooled = MaskedGlobalPooling(mode="mean")(x)
    >>> tuple(pooled.shape)
    (None, 16)
    """

    def __init__(self, mode="mean", **kwargs):
        if mode not in _MODES:
            raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
        super().__init__(**kwargs)
        self.mode = mode
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                f"`inputs` must have rank 3 (batch, seq, features). Received: inputs.shape={tuple(input_shape)}"
            )

    def call(self, inputs, mask=None):
        accumulation = "float64" if keras.backend.standardize_dtype(inputs.dtype) == "float64" else "float32"
        values = ops.cast(inputs, accumulation)  # (batch, seq, features)
        if mask is None:
            mask = ops.ones(ops.shape(inputs)[:2], dtype="bool")
        _check_mask(mask, inputs)
        keep = ops.expand_dims(ops.cast(mask, "bool"), -1)  # (batch, seq, 1)
        count = ops.sum(ops.cast(keep, accumulation), axis=1)  # (batch, 1)
        if self.mode == "mean":
            total = ops.sum(ops.where(keep, values, 0.0), axis=1)  # (batch, features)
            pooled = total / ops.maximum(count, 1.0)
        else:
            lowest = float(np.finfo(accumulation).min)
            largest = ops.max(ops.where(keep, values, lowest), axis=1)  # (batch, features)
            pooled = ops.where(count > 0.0, largest, 0.0)
        return ops.cast(pooled, self.compute_dtype)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode})
        return config


def _check_mask(mask, inputs):
    """The mask must be `(batch, seq)` like the first two axes of `inputs` (where known)."""
    mask_shape, expected = tuple(mask.shape), tuple(inputs.shape[:2])
    if len(mask_shape) != 2 or any(m is not None and e is not None and m != e for m, e in zip(mask_shape, expected)):
        raise ValueError(f"`mask` must have shape (batch, seq)={expected}. Received: mask.shape={mask_shape}")
