"""Small helpers shared by the keras_attn layers: dtypes, masks and shape checks (not public API;
argument checks live in `keras_attn.validation`)."""

import keras
import numpy as np

from keras_attn import keras_internals


def float_math_dtype(dtype):
    """The dtype for numerically sensitive math (softmax, positions, angles) given a tensor or
    compute dtype: float64 for float64, float32 otherwise, never 16 bits."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def compiled_by_xla():
    """Whether what is being traced now will run under XLA (`tf.function(jit_compile=True)`,
    `Model.compile(jit_compile=True)`; TensorFlow backend): XLA fuses transposes and updates a
    buffer in place, TensorFlow's op-by-op runtime pays for every op and copy, so a few paths
    choose their ops by it."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def asserted(valid, tensor, message):
    """`tensor` behind a run-time assertion that the scalar bool tensor `valid` holds (an
    `InvalidArgumentError` showing `message`, a list of strings and tensors), in a graph that
    TensorFlow runs op by op (`tf.function`). Under XLA (`jit_compile=True`), which drops an Assert
    op (logging "Ignoring Assert operator"), none is added and `tensor` is returned as it is: the
    caller makes a failed check visible there (`nan_unless`, docs/guides/kernels.md's list)."""
    if compiled_by_xla():
        return tensor
    import tensorflow as tf

    check = tf.debugging.Assert(valid, message)
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def nan_unless(valid, tensor):
    """Float `tensor` where the bool tensor `valid` (broadcastable to it) holds and NaN elsewhere,
    under XLA only: there a check cannot stop the run (`asserted`), so what it guards turns NaN
    instead of silently wrong. `tensor` unchanged outside XLA or when `valid` is `None`."""
    if valid is None or not compiled_by_xla():
        return tensor
    return keras.ops.where(valid, tensor, keras.ops.full_like(tensor, float("nan")))


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so that sublayers never share one seeded instance."""
    return initializer.__class__.from_config(initializer.get_config())


def as_float_inputs(inputs, dtype):
    """`inputs` cast to `dtype` (a layer's compute dtype) when they are integers or booleans, as
    Keras's layers take them (`Dense`, `MultiHeadAttention`, `LayerNormalization` promote them to
    float); float inputs unchanged (Keras's autocasting has given them the layer's dtype). Read a
    Keras mask of `inputs` before: the cast tensor has none."""
    inputs = keras.ops.convert_to_tensor(inputs)
    if "float" in keras.backend.standardize_dtype(inputs.dtype):
        return inputs
    return keras.ops.cast(inputs, dtype)


def keras_mask(tensor):
    """The Keras mask a mask-producing layer upstream attached to `tensor`, or `None`."""
    return getattr(tensor, "_keras_mask", None)


def check_padding_mask(name, mask, inputs_shape=None):
    """Raises a `ValueError` unless `mask` is `None` or has rank 2 `(batch, seq)` fitting the first
    two sizes of `inputs_shape` where both are known (a batch of 1 broadcasts): a wrong length
    would otherwise fail deep inside the layer, or broadcast."""
    if mask is None:
        return
    if len(mask.shape) != 2:
        raise ValueError(f"`{name}` must have rank 2 (batch, seq). Received: {name}.shape={tuple(mask.shape)}")
    if inputs_shape is None:
        return
    expected = tuple(inputs_shape[:2])
    batch_ok = mask.shape[0] in (None, 1, expected[0]) or expected[0] is None  # a batch of 1 broadcasts
    if not batch_ok or None not in (mask.shape[1], expected[1]) and mask.shape[1] != expected[1]:
        raise ValueError(
            f"`{name}` must have shape (batch, seq)={expected} of the inputs. Received: {name}.shape={tuple(mask.shape)}"
        )


def check_built_input_shapes(layer, **inputs):
    """Raises a `ValueError` naming the input (`query`, `value` or `key`, the tensors given) whose
    rank or feature size is not the one `layer` was built for (its projections' kernels are sized by
    it): TensorFlow would fail deep inside a projection's reshape, naming no argument. A `value`
    built from the query's shape (self-attention) and a `key` from the value's are expected to
    match those; a layer not built yet passes (building checks the shapes)."""
    built = keras_internals.build_shapes(layer)
    if not built:
        return
    expected = {"query": built.get("query_shape")}
    expected["value"] = built.get("value_shape") or expected["query"]
    expected["key"] = built.get("key_shape") or expected["value"]
    for name, tensor in inputs.items():
        shape = expected[name]
        if shape is None:
            continue
        features = tensor.shape[-1] if len(tensor.shape) else None
        if len(tensor.shape) != len(shape) or None not in (features, shape[-1]) and features != shape[-1]:
            wanted = (None,) * (len(shape) - 1) + (shape[-1],)
            raise ValueError(
                f"`{name}` must have the rank and the feature size (last axis) that {type(layer).__name__} "
                f"{layer.name!r} was built for. Expected: {name}.shape={wanted}, "
                f"received: {name}.shape={tuple(tensor.shape)}"
            )


def check_leading_sizes(reference, axes, **tensors):
    """Raises a `ValueError` naming the tensor whose first `axes` sizes (1: the batch; 2: batch and
    length) are not those of `tensors[reference]` where both are known; `None` tensors are skipped.
    TensorFlow would fail in a broadcast or a matmul, naming no argument, or worse broadcast."""
    expected = tuple(tensors[reference].shape[:axes])
    for name, tensor in tensors.items():
        if tensor is None or not hasattr(tensor, "shape"):
            continue
        received = tuple(tensor.shape[:axes])
        if any(None not in (a, b) and a != b for a, b in zip(received, expected)) or len(received) < axes:
            what = "batch" if axes == 1 else "(batch, length)"
            raise ValueError(
                f"`{name}` must have the {what} of `{reference}`, {expected}. "
                f"Received: {name}.shape={tuple(tensor.shape)}, {reference}.shape={tuple(tensors[reference].shape)}"
            )


def check_sequence_shape(name, shape):
    """Raises a `ValueError` unless `shape` is `(batch, seq, features)` with known features."""
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"`{name}` must have rank 3 (batch, seq, features) with a known feature size. "
            f"Received: {name}.shape={tuple(shape)}"
        )


def checked_ids(name, ids, size, size_name):
    """`ids`, once every id is known to be a whole number in `[0, size)`: an embedding lookup would
    otherwise read the wrong row silently (a negative id wraps to the last rows, a float id is
    truncated, and under XLA an id past the end is clamped to the last row).

    Eagerly a `ValueError` naming `name` and the bad ids; in a graph (`tf.function`, TensorFlow
    backend) a run-time assertion (`InvalidArgumentError`) naming `name`. Under XLA
    (`jit_compile=True`), which drops assertions, no Assert op: the caller turns what it looked
    up NaN when an id is out of range (`nan_unless(valid_ids(ids, size), ...)`).
    """
    import tensorflow as tf

    ids = tf.convert_to_tensor(ids)
    message = f"`{name}` must hold whole-number ids in [0, {size_name}={size})"
    if not tf.is_symbolic_tensor(ids):
        values = ids.numpy()
        bad = values[(values < 0) | (values >= size) | (values != np.floor(values))]
        if bad.size:
            shown = ", ".join(str(value) for value in sorted(set(bad.tolist()))[:5])
            raise ValueError(f"{message}. Received: {name} holding {shown} ({bad.size} not valid)")
        return ids
    low, high = tf.reduce_min(ids), tf.reduce_max(ids)
    valid = tf.logical_and(low >= 0, high < tf.cast(size, high.dtype))
    if ids.dtype.is_floating:
        valid = tf.logical_and(valid, tf.reduce_all(tf.equal(ids, tf.floor(ids))))
    return asserted(valid, ids, [f"{message}. Received: {name} with min", low, "max", high])


def valid_ids(ids, size):
    """Scalar bool tensor: whether every id of `ids` is in `[0, size)` (`checked_ids`' bounds), or
    `None` outside XLA, where `checked_ids` stops the run instead. For `nan_unless` on the lookup."""
    if not compiled_by_xla():
        return None
    ids = keras.ops.convert_to_tensor(ids)
    inside = keras.ops.logical_and(keras.ops.min(ids) >= 0, keras.ops.max(ids) < keras.ops.cast(size, ids.dtype))
    if "float" in keras.backend.standardize_dtype(ids.dtype):
        inside = keras.ops.logical_and(inside, keras.ops.all(keras.ops.equal(ids, keras.ops.floor(ids))))
    return inside


def padding_to_multiple(length, multiple):
    """How many positions pad `length` (an int or a scalar tensor) up to a multiple of `multiple`."""
    # Non-negative operands only: tf2onnx turns an integer FloorMod into x - trunc(x / y) * y, which
    # differs from Python's % for a negative x (-11 % 4 would give -3, not 1).
    return (multiple - length % multiple) % multiple
