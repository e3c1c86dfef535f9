"""Where each token sits: the position arguments shared by the position encodings, embeddings and rotary.

A position layer (`SinusoidalPositionEncoding`, `PositionEmbedding`, `TokenAndPositionEmbedding`,
`RotaryEmbedding`) is told where its tokens sit by at most one of three call arguments, each with
one meaning:

- `start_index` (int >= 0 or scalar int tensor, default 0): one sequence per row, at the
  contiguous positions `start_index .. start_index + seq - 1` (cached decoding feeds one at a time);
- `positions` (int `(batch, seq)`): the position of every token, e.g. a packed row's positions
  from a packer, or a decoding step of several packed documents each at its own position;
- `segment_ids` (int `(batch, seq)`, 0 for padding): the documents of a packed row; each token
  sits at its position within its document, `keras_attn.core.segments.document_positions`, so a
  document packed at offset 300 is encoded exactly as it is alone.
"""

import numbers

import numpy as np
import tensorflow as tf
from keras import ops

from keras_attn.core.segments import document_positions
from keras_attn.validation import MAX_ELEMENTS
from keras_attn.validation import check_position
from keras_attn.validation import check_segment_ids
from keras_attn.validation import check_tensor


def token_positions(inputs_shape, start_index=0, positions=None, segment_ids=None):
    """Int32 `(batch, seq)` positions of the tokens, or `None` for the contiguous range from `start_index`.

    Args:
        inputs_shape: the shape of the layer's inputs, `(batch, seq, ...)`.
        start_index, positions, segment_ids: the call's arguments (module docstring); at most one
            of them is given (`start_index` left at 0 when another is).
    """
    check_position("start_index", start_index)
    given = {name: ids for name, ids in (("positions", positions), ("segment_ids", segment_ids)) if ids is not None}
    if not given:
        return None
    if len(given) == 2:
        raise ValueError(
            "Pass either `positions` (each token's position) or `segment_ids` (positions restarting per document), "
            f"not both. Received: positions.shape={_shape(positions)}, segment_ids.shape={_shape(segment_ids)}"
        )
    ((name, ids),) = given.items()
    if not (isinstance(start_index, numbers.Integral) and start_index == 0):  # a tensor may hold anything
        raise ValueError(
            f"`start_index` offsets contiguous positions; with `{name}` every token's position is given, so "
            f"`start_index` must stay 0 (add the offset to `positions`). Received: start_index={start_index!r}"
        )
    batch, length = inputs_shape[:2]
    if name == "segment_ids":
        return document_positions(check_segment_ids(name, ids, batch, length, of="`inputs`"))
    ids = check_tensor(name, ids, dtype="int", rank=2, shape=(batch, length), at_least=0, at_most=MAX_ELEMENTS)
    return tf.cast(ids, tf.int32)


def float_token_positions(inputs, dtype, start_index=0, positions=None, segment_ids=None):
    """The positions of the tokens of `inputs` `(batch, seq, ...)` in float `dtype`: `(batch, seq)`,
    or `(1, seq)` when they are the contiguous range from `start_index` (the same for every row)."""
    per_token = token_positions(inputs.shape, start_index, positions, segment_ids)
    if per_token is not None:
        return ops.cast(per_token, dtype)
    return ops.expand_dims(ops.arange(ops.shape(inputs)[1], dtype=dtype) + ops.cast(start_index, dtype), 0)


def _shape(tensor):
    return None if tensor is None else tuple(getattr(tensor, "shape", np.shape(tensor)))
