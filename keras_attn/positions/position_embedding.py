"""Learned absolute position embedding."""

import keras
from keras import ops

from keras_attn.positions.token_positions import token_positions
from keras_attn.utils import asserted
from keras_attn.utils import checked_ids
from keras_attn.utils import compiled_by_xla
from keras_attn.utils import nan_unless
from keras_attn.utils import valid_ids
from keras_attn.validation import check_elements
from keras_attn.validation import check_position
from keras_attn.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embedding, one trainable vector per position.

    Returns the embeddings of positions `start_index .. start_index + seq - 1` broadcast to
    the shape of `inputs` (add them to the token embeddings yourself, or use
    `TokenAndPositionEmbedding`). Positions past `sequence_length` are an error, never a
    silent truncation: a `ValueError` when the length is known when the layer is called, and
    a runtime assertion (TensorFlow backend) when it is only known when the graph runs; under
    XLA (`jit_compile=True`), which drops assertions, the embeddings are NaN instead.

    Args:
        sequence_length: the maximum number of positions.
        initializer: initializer of the `(sequence_length, features)` embedding matrix.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, seq, features)`; only its shape is used.
        start_index: int or scalar int tensor, the position of the first element of `inputs`
            (cached decoding feeds one position at a time).
        positions: optional int `(batch, seq)`, the position of every element instead, each in
            `[0, sequence_length)` (checked as `token_ids` are by `TokenAndPositionEmbedding`).
        segment_ids: optional int `(batch, seq)` documents of a packed row (0 for padding):
            positions restart at 0 in each document (`keras_attn.document_positions`), so each
            document gets the embeddings it gets alone. At most one of `start_index` (non-zero),
            `positions` and `segment_ids` (`keras_attn.positions.token_positions`).

    Returns:
        `(batch, seq, features)` position embeddings in the compute dtype.

    Example:

    >>> tokens = keras.layers.Embedding(100, 16)(keras.ops.ones((2, 10), "int32"))
    >>> x = tokens + PositionEmbedding(sequence_length=32)(tokens)
    >>> tuple(x.shape)
    (2, 10, 16)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        check_positive_int("sequence_length", sequence_length)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have rank 3 (batch, seq, features) with a known feature size. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        check_elements("The position embedding table", sequence_length=self.sequence_length, features=inputs_shape[-1])
        # Checked by Keras at every call: another width would slice the table silently.
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: inputs_shape[-1]}, name="inputs")
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
        )

    def _length_fits(self, length, start_index):
        """`(fits, end)`: whether `end = start_index + length <= sequence_length`. A `ValueError` when it
        does not and both are Python ints (then `(None, None)`), else scalar tensors, asserted where
        TensorFlow can (`_checked`) and, under XLA, the embeddings' NaN when false (`nan_unless`), so
        the slice never silently reads past the table."""
        check_position("start_index", start_index)
        if isinstance(length, int) and isinstance(start_index, int):
            if start_index + length > self.sequence_length:
                raise ValueError(
                    f"Position embedding: start_index + input length = {start_index} + {length} = "
                    f"{start_index + length} exceeds sequence_length={self.sequence_length}."
                )
            return None, None
        end = ops.cast(start_index, "int32") + ops.cast(length, "int32")
        return end <= self.sequence_length, end

    def _checked(self, fits, end, tensor):
        """`tensor` behind the run-time check `fits` of `_length_fits` (`None`: checked already)."""
        if fits is None:
            return tensor
        message = (
            f"Position embedding: start_index + input length (below) exceeds sequence_length={self.sequence_length}"
        )
        return asserted(fits, tensor, [message, end])

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        length = inputs.shape[1] if inputs.shape[1] is not None else ops.shape(inputs)[1]
        per_token = token_positions(inputs.shape, start_index, positions, segment_ids)  # (batch, seq) or None
        if per_token is not None:
            return self._embeddings_at(per_token, length, given=positions is not None)
        fits, end = self._length_fits(length, start_index)
        length = self._checked(fits, end, length)
        if fits is not None and compiled_by_xla():  # a read inside the table, NaN below when it does not fit
            start_index = ops.where(fits, ops.cast(start_index, "int32"), 0)
        embeddings = ops.slice(
            self.position_embeddings, (start_index, 0), (length, inputs.shape[-1])
        )  # (seq, features)
        embeddings = nan_unless(fits, ops.cast(embeddings, self.compute_dtype))
        return ops.broadcast_to(ops.expand_dims(embeddings, 0), ops.shape(inputs))  # (batch, seq, features)

    def _embeddings_at(self, per_token, length, given):
        """The embeddings `(batch, seq, features)` of int32 positions `(batch, seq)`, read only from the table.

        Given `positions` are checked against the table (`checked_ids`); positions within
        documents (`segment_ids`) are below the row length, which is checked instead.
        """
        if given:
            per_token = checked_ids("positions", per_token, self.sequence_length, "sequence_length")
            fits = valid_ids(per_token, self.sequence_length)
        else:
            fits, end = self._length_fits(length, 0)
            per_token = self._checked(fits, end, per_token)
        return nan_unless(fits, ops.cast(ops.take(self.position_embeddings, per_token, axis=0), self.compute_dtype))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
