"""Global pooling over the real (unmasked) positions of a sequence."""

import keras
import numpy as np
from keras import ops

from keras_attn.blocks.documents import token_documents
from keras_attn.utils import nan_unless
from keras_attn.validation import check_choice
from keras_attn.validation import check_positive_int

_MODES = ("mean", "max")


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedGlobalPooling(keras.layers.Layer):
    """Mean or max over the sequence axis, counting only positions the mask keeps; per document of packed rows.

    `keras.layers.GlobalAveragePooling1D` divides by the number of real tokens too, but a
    sequence with no real token gives `0 / 0`; `GlobalMaxPooling1D` ignores the mask. Here
    padding never takes part: the mean divides by the number of real positions, the max takes
    the largest value among real positions, and a sequence whose positions are all masked
    pools to exact zeros (never NaN or `-inf`). Sums run in float32 (float64 for float64 inputs).

    With `segment_ids` (rows packed with several documents, `keras_attn.packing.pack`), each
    document pools alone: the output holds one vector per document, `(batch, max_documents,
    features)`, document `s` of a row at index `s - 1`, equal to pooling that document by itself.

    Args:
        mode: `"mean"` or `"max"`.
        max_documents: the most documents a packed row holds (the size of the output's document
            axis); needed to call with `segment_ids`.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`.
        mask: optional boolean `(batch, seq)`, `True` for real positions. Taken from the Keras
            mask of the inputs (`Embedding(mask_zero=True)` upstream) when not given; without
            any mask every position counts.
        segment_ids: optional int `(batch, seq)`: each position's document `1..max_documents`
            within its row, `0` for padding.

    Returns:
        `(batch, features)`, or `(batch, max_documents, features)` with `segment_ids`, in the
        compute dtype; a document with no real position pools to zeros. The output carries no mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 16, mask_zero=True)(tokens)
    >>> pooled = MaskedGlobalPooling(mode="mean")(x)
    >>> tuple(pooled.shape)
    (None, 16)

    One vector per document of a packed row:

    >>> values = ops.convert_to_tensor([[[1.0], [3.0], [10.0], [0.0]]])
    >>> segment_ids = ops.convert_to_tensor([[1, 1, 2, 0]])
    >>> MaskedGlobalPooling("mean", max_documents=3)(values, segment_ids=segment_ids).numpy()[..., 0].tolist()
    [[2.0, 10.0, 0.0]]
    """

    def __init__(self, mode="mean", max_documents=None, **kwargs):
        check_choice("mode", mode, _MODES)
        check_positive_int("max_documents", max_documents, allow_none=True)
        super().__init__(**kwargs)
        self.mode = mode
        self.max_documents = max_documents
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                f"`inputs` must have rank 3 (batch, seq, features). Received: inputs.shape={tuple(input_shape)}"
            )
        self.input_spec = keras.layers.InputSpec(ndim=3, name="inputs")  # checked at every call, not only the first

    def call(self, inputs, mask=None, segment_ids=None):
        accumulation = "float64" if keras.backend.standardize_dtype(inputs.dtype) == "float64" else "float32"
        if mask is not None:
            _check_mask(mask, inputs)
        documents, count, valid = token_documents(inputs, mask, segment_ids, self.max_documents)
        values = ops.cast(inputs, accumulation)  # (batch, seq, features)
        members = ops.cast(ops.equal(documents[:, :, None], ops.arange(1, count + 1, dtype="int32")), accumulation)
        real = ops.expand_dims(ops.sum(members, axis=1), -1)  # (batch, count, 1): positions of each document
        if self.mode == "mean":
            kept = ops.where(ops.expand_dims(documents > 0, -1), values, 0.0)  # padding's NaN * 0 would be NaN
            pooled = ops.einsum("bsd,bsf->bdf", members, kept) / ops.maximum(real, 1.0)
        else:
            pooled = ops.where(real > 0.0, _document_max(values, documents, count), 0.0)
        pooled = nan_unless(valid, ops.cast(pooled, self.compute_dtype))
        return pooled if segment_ids is not None else pooled[:, 0]

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape, segment_ids_shape=None):
        if segment_ids_shape is None:
            return (inputs_shape[0], inputs_shape[-1])
        return (inputs_shape[0], self.max_documents, inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode, "max_documents": self.max_documents})
        return config


def _document_max(values, documents, count):
    """`(batch, count, features)`: the max of `values` over each document's positions (`documents`
    numbering them `1..count` per row, 0 for none), the lowest float for a document without any."""
    batch, features = ops.shape(values)[0], values.shape[-1]
    segments = batch * count + 1  # one per (row, document), and a last one for the padding, dropped
    first = ops.arange(batch, dtype="int32")[:, None] * count  # (batch, 1): each row's first segment
    index = ops.reshape(ops.where(documents > 0, first + documents - 1, batch * count), (-1,))
    # A lowest-value row in every segment: none is empty, whatever a backend or an ONNX converter
    # makes of an empty segment's max (tf2onnx's gives NaN).
    lowest = ops.full((segments, features), float(np.finfo(keras.backend.standardize_dtype(values.dtype)).min))
    data = ops.concatenate([ops.reshape(values, (-1, features)), ops.cast(lowest, values.dtype)], axis=0)
    index = ops.concatenate([index, ops.arange(segments, dtype="int32")], axis=0)
    return ops.reshape(ops.segment_max(data, index, segments)[:-1], (batch, count, features))


def _check_mask(mask, inputs):
    """The mask must be `(batch, seq)` like the first two axes of `inputs` (where known)."""
    mask_shape, expected = tuple(mask.shape), tuple(inputs.shape[:2])
    if len(mask_shape) != 2 or any(m is not None and e is not None and m != e for m, e in zip(mask_shape, expected)):
        raise ValueError(f"`mask` must have shape (batch, seq)={expected}. Received: mask.shape={mask_shape}")
