"""Which document of a packed row each position belongs to: the one reading of segment ids for the pooling layers."""

from keras import ops

from keras_attn.core.segments import resolve_segment_ids
from keras_attn.utils import checked_ids
from keras_attn.utils import valid_ids


def token_documents(inputs, mask, segment_ids, max_documents):
    """`(documents, count, valid)`: int32 `(batch, seq)` holding each position's document `1..count`
    (0: in none, padding or masked), `count`, the documents a row can hold, and `valid`, for
    `nan_unless` on the pooled output (`None` but under XLA).

    Without `segment_ids` a row is one document (its real positions); with them `count` is
    `max_documents`, which must be given, and an id past it is refused (its tokens would
    otherwise be dropped silently): an error, or under XLA, which drops assertions, `valid` is
    `False` and the caller's output NaN.
    """
    if segment_ids is None:
        if mask is None:
            return ops.ones(ops.shape(inputs)[:2], "int32"), 1, None
        return ops.cast(ops.cast(mask, "bool"), "int32"), 1, None
    if max_documents is None:
        raise ValueError(
            "Pooling per document (`segment_ids`) needs `max_documents`, the size of the output's document axis. "
            f"Received: max_documents=None, segment_ids.shape={tuple(segment_ids.shape)}"
        )
    length = inputs.shape[1]
    segment_ids, _ = resolve_segment_ids(segment_ids, None, None, length, length, inputs.shape[0])
    segment_ids = checked_ids("segment_ids", segment_ids, max_documents + 1, "max_documents + 1")
    valid = valid_ids(segment_ids, max_documents + 1)
    if mask is not None:
        segment_ids = ops.where(ops.cast(mask, "bool"), segment_ids, 0)
    return segment_ids, max_documents, valid
