"""The signature of an attention call: everything the kernels' support, features and speed read
from it, as a hashable key (the dispatcher's choices and measured times are kept per signature)."""

import json

import keras


def signature(call):
    """A hashable key of everything the kernels' support and features read from an `AttentionCall`."""

    def shape(tensor):
        return None if tensor is None else tuple(tensor.shape)

    return (
        keras.backend.backend(),
        shape(call.query),
        shape(call.key),
        shape(call.value),
        keras.backend.standardize_dtype(call.query.dtype),
        keras.backend.standardize_dtype(call.value.dtype),
        shape(call.mask),
        shape(call.bias),
        None
        if call.pattern is None
        else json.dumps(keras.saving.serialize_keras_object(call.pattern), sort_keys=True, default=str),
        call.query_offset
        if isinstance(call.query_offset, int) and not isinstance(call.query_offset, bool)
        else "tensor",
        call.dropout_rate > 0.0,
        call.training,
        call.return_weights,
        call.hard,
        call.position_bias is not None,
        shape(call.query_segment_ids),
    )
