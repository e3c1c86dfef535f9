"""Argument checks: the one helper every public constructor and call uses.

Each check raises a `ValueError` that names the argument and quotes the value received
(`Received: name=value`, as Keras's own layers do), or returns the value it accepted. Numbers are
real, finite and in range (NaN and infinities pass no `<=` test by accident: they are refused
first); booleans are real booleans (the string `"no"` is truthy, `1` is not a choice between two
states); strings are one of the known choices; tensors are checked by value when eager.
"""

import math
import numbers

import keras
import numpy as np

# The largest size, count or position an argument may have, and the most elements one weight,
# table or mask may hold: TensorFlow indexes tensors and computes positions in int32, so a larger
# size overflows an index, and a larger tensor is refused (or exhausts memory) only once it is
# being allocated. Sizes past it are refused up front, naming the argument.
MAX_ELEMENTS = 2**31 - 1
# The largest finite float32: the logits are computed in float32, where a larger scale is `inf`.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The smallest normal float32: a smaller (subnormal) cap is read as 0 by CPUs that flush
# subnormals, and `x / cap` is then `inf` or NaN.
FLOAT32_SMALLEST_NORMAL = float(np.finfo(np.float32).smallest_normal)


def check_number(name, value, *, above=None, at_least=None, below=None, integer=False, allow_none=False):
    """`value` if it is a finite real number (an integer if `integer`) within the bounds, else a
    `ValueError` naming `name`.

    >>> check_number("rate", 0.5, at_least=0, below=1)
    0.5
    >>> check_number("max_wavelength", float("nan"), above=1)
    Traceback (most recent call last):
    ...
    ValueError: argument `max_wavelength` must be a finite number > 1. Received: max_wavelength=nan
    """
    if value is None and allow_none:
        return value
    kind = numbers.Integral if integer else numbers.Real
    valid = (
        isinstance(value, kind)
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
        and (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (below is None or value < below)
    )
    if not valid:
        bounds = [
            f"> {above}" if above is not None else None,
            f">= {at_least}" if at_least is not None else None,
            f"< {below}" if below is not None else None,
        ]
        expected = ("an integer" if integer else "a finite number") + "".join(f" {b}" for b in bounds if b)
        expected = expected.replace(" >= 0 < 1", " in [0, 1)") + (" or None" if allow_none else "")
        raise ValueError(f"argument `{name}` must be {expected}. Received: {name}={value!r}")
    return value


def check_positive_int(name, value, allow_none=False):
    """`value` if it is an int in `[1, MAX_ELEMENTS]` (or an allowed `None`), else a `ValueError` naming `name`.

    >>> check_positive_int("num_heads", 2**40)
    Traceback (most recent call last):
    ...
    ValueError: argument `num_heads` must be a positive integer <= 2147483647 (2**31 - 1). Received: num_heads=1099511627776
    """
    if value is None and allow_none:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or not 0 < value <= MAX_ELEMENTS:
        expected = f"a positive integer <= {MAX_ELEMENTS} (2**31 - 1)" + (" or None" if allow_none else "")
        raise ValueError(f"argument `{name}` must be {expected}. Received: {name}={value!r}")
    return value


def check_elements(what, **sizes):
    """A `ValueError` naming the arguments when `what` (a weight or table) of shape `sizes` (argument
    name -> size; `None` for a size not known yet) would hold more than `MAX_ELEMENTS` elements.

    >>> check_elements("The token embedding table", vocabulary_size=2**20, embedding_dim=2**12)
    Traceback (most recent call last):
    ...
    ValueError: The token embedding table (vocabulary_size x embedding_dim) would hold 4294967296 elements, more than one tensor can (2147483647, 2**31 - 1). Received: vocabulary_size=1048576, embedding_dim=4096
    """
    known = {name: size for name, size in sizes.items() if size is not None}
    elements = math.prod(known.values())
    if elements > MAX_ELEMENTS:
        raise ValueError(
            f"{what} ({' x '.join(known)}) would hold {elements} elements, more than one tensor can "
            f"({MAX_ELEMENTS}, 2**31 - 1). Received: " + ", ".join(f"{name}={size!r}" for name, size in known.items())
        )


def check_rate(name, rate):
    """`rate` if it is a number in [0, 1), else a `ValueError` naming `name`."""
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
        raise ValueError(f"argument `{name}` must be a number in [0, 1). Received: {name}={rate!r}")
    return rate


def check_bool(name, value, allow_none=False, allow_int=False):
    """`value` as a `bool` if it is a real boolean (Python or NumPy), or with `allow_int` the int 0
    or 1 (which Keras's layers take as truth values), else a `ValueError` naming `name`.

    >>> check_bool("causal", "no")
    Traceback (most recent call last):
    ...
    ValueError: argument `causal` must be True or False. Received: causal='no'
    """
    if value is None and allow_none:
        return value
    is_bit = allow_int and isinstance(value, numbers.Integral) and value in (0, 1)
    if not (isinstance(value, (bool, np.bool_)) or is_bit):
        expected = "True, False or None" if allow_none else "True or False" + (" (or 0 or 1)" if allow_int else "")
        raise ValueError(f"argument `{name}` must be {expected}. Received: {name}={value!r}")
    return bool(value)


def check_choice(name, value, choices):
    """`value` if it is one of `choices`, else a `ValueError` naming `name` and the choices."""
    if isinstance(value, (bool, np.bool_)) or value not in choices:
        raise ValueError(f"argument `{name}` must be one of {tuple(choices)}. Received: {name}={value!r}")
    return value


def check_projection_sizes(num_heads, key_dim, value_dim, features=None, output_dim=None):
    """A `ValueError` naming the sizes when a kernel of multi-head attention's projections would hold
    more than `MAX_ELEMENTS`: query and key `(features, num_heads, key_dim)`, value `(features,
    num_heads, value_dim)`, output `(num_heads, value_dim, output_dim or features)`. Before build
    (`features=None`) the heads and their depth alone, a lower bound."""
    check_elements("The query and key projection kernels", features=features, num_heads=num_heads, key_dim=key_dim)
    check_elements("The value projection kernel", features=features, num_heads=num_heads, value_dim=value_dim)
    output = output_dim or features
    check_elements("The output projection kernel", num_heads=num_heads, value_dim=value_dim, output_dim=output)


def check_scale(scale):
    """`scale` if the inverse temperature is `None` or positive and at most `FLOAT32_MAX`, else a `ValueError`.

    A tensor is checked by value when its value is known (eager); a symbolic tensor passes.
    """
    if scale is None:
        return scale
    if hasattr(scale, "dtype") and not isinstance(scale, numbers.Real):
        try:
            values = np.asarray(keras.ops.convert_to_numpy(scale), dtype="float64")
        except Exception:  # symbolic: its value is known only at run time
            return scale
        if values.size and np.all(values > 0) and np.all(values <= FLOAT32_MAX):  # NaN fails both
            return scale
        raise ValueError(
            f"argument `scale` must be positive and at most {FLOAT32_MAX} (float32). Received: scale={scale!r}"
        )
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not 0 < scale <= FLOAT32_MAX:
        raise ValueError(
            f"argument `scale` must be a positive finite number or None, at most {FLOAT32_MAX} (the largest float32: "
            f"the logits are computed in float32). Received: scale={scale!r}"
        )
    return scale


def check_soft_cap(soft_cap, name="logit_soft_cap"):
    """`soft_cap` if it is `None` or a normal float32 number, in `[FLOAT32_SMALLEST_NORMAL,
    FLOAT32_MAX]` (about `[1.18e-38, 3.4e38]`), else a `ValueError` naming `name`.

    Over that range `keras_attn.core.softmax.soft_capped` is accurate to float32 rounding for every
    float32 logit, forward and backward; a larger cap is not a float32 number, a subnormal one is
    read as 0 where subnormals are flushed (CPUs), which turns `x / cap` into `inf` or NaN.

    >>> check_soft_cap(50.0)
    50.0
    >>> check_soft_cap(1e-40)
    Traceback (most recent call last):
    ...
    ValueError: argument `logit_soft_cap` must be a number in [1.1754943508222875e-38, 3.4028234663852886e+38] (a normal float32) or None. Received: logit_soft_cap=1e-40
    """
    if soft_cap is None:
        return soft_cap
    if (
        isinstance(soft_cap, (bool, np.bool_))
        or not isinstance(soft_cap, numbers.Real)
        or not FLOAT32_SMALLEST_NORMAL <= soft_cap <= FLOAT32_MAX
    ):
        raise ValueError(
            f"argument `{name}` must be a number in [{FLOAT32_SMALLEST_NORMAL}, {FLOAT32_MAX}] (a normal float32) or None. "
            f"Received: {name}={soft_cap!r}"
        )
    return soft_cap


def check_position(name, value):
    """`value` if the position (or length) is an int in `[0, MAX_ELEMENTS]` or an integer tensor whose
    values, when known (eager), lie there too, else a `ValueError`: a float would give fractional
    positions, a negative int positions before the sequence, a larger one overflows TensorFlow's
    int32 positions. A symbolic tensor (a graph's, XLA's) is checked by dtype only.

    >>> check_position("query_offset", np.int32(-3))
    Traceback (most recent call last):
    ...
    ValueError: argument `query_offset` must be an int in [0, 2147483647] or an integer tensor. Received: query_offset=np.int32(-3)
    """
    if isinstance(value, numbers.Number) or not hasattr(value, "dtype"):
        valid = (
            isinstance(value, numbers.Integral)
            and not isinstance(value, (bool, np.bool_))
            and 0 <= value <= MAX_ELEMENTS
        )
    else:
        values = _known_values(value) if "int" in keras.backend.standardize_dtype(value.dtype) else np.array(-1)
        valid = values is None or bool(np.all((values >= 0) & (values <= MAX_ELEMENTS)))
    if not valid:
        tensor = "" if isinstance(value, numbers.Number) or not hasattr(value, "dtype") else " of values in that range"
        raise ValueError(
            f"argument `{name}` must be an int in [0, {MAX_ELEMENTS}] or an integer tensor{tensor}. Received: {name}={value!r}"
        )
    return value


def check_same_batch(**tensors):
    """A `ValueError` naming the tensors (`name=tensor`, `None` skipped) unless their known batch sizes
    (first axis) agree: a batch of 1 would broadcast silently, another one fail in a TensorFlow op.

    >>> check_same_batch(query=np.ones((2, 3)), key=np.ones((1, 3)))
    Traceback (most recent call last):
    ...
    ValueError: `query` and `key` must have the same batch size. Received: query.shape=(2, 3), key.shape=(1, 3)
    """
    given = {name: tensor for name, tensor in tensors.items() if tensor is not None}
    if len({tensor.shape[0] for tensor in given.values() if tensor.shape[0] is not None}) > 1:
        names = [f"`{name}`" for name in given]
        raise ValueError(
            f"{', '.join(names[:-1])} and {names[-1]} must have the same batch size. Received: "
            + ", ".join(f"{name}.shape={tuple(tensor.shape)}" for name, tensor in given.items())
        )


def check_broadcastable(to=None, **tensors):
    """A `ValueError` naming the tensors (`name=tensor`, `None` skipped) unless their known shapes
    broadcast to one another (NumPy's rule), or, with `to` (a `name=tensor` of them), to that
    one's shape without changing it. Unknown sizes (a graph's) pass.

    >>> check_broadcastable(mask=np.ones((4, 3)), to="logits", logits=np.ones((2, 3)))
    Traceback (most recent call last):
    ...
    ValueError: `mask` must be broadcastable to `logits`. Received: mask.shape=(4, 3), logits.shape=(2, 3)
    """
    shapes = {name: _static_shape(tensor) for name, tensor in tensors.items() if tensor is not None}
    shapes = {name: shape for name, shape in shapes.items() if shape is not None}
    target = shapes.get(to)
    rank = max(map(len, shapes.values()), default=0)
    for axis in range(1, rank + 1):
        sizes = {shape[-axis] for shape in shapes.values() if len(shape) >= axis and shape[-axis] not in (None, 1)}
        fits = len(sizes) <= 1
        if target is not None:  # the target's size, unless unknown, is the only one allowed past 1
            fits = len(target) >= axis and (sizes <= {target[-axis]} if target[-axis] is not None else fits)
        if not fits:
            received = ", ".join(f"{name}.shape={shape}" for name, shape in shapes.items())
            names = [f"`{name}`" for name in shapes if name != to]
            together = f"{', '.join(names[:-1])} and {names[-1]} must broadcast to one another"
            wording = f"{' and '.join(names)} must be broadcastable to `{to}`" if to is not None else together
            raise ValueError(f"{wording}. Received: {received}")


def _static_shape(tensor):
    """The shape of a tensor (or nested list) as a tuple, `None` sizes unknown; `None` for an unknown rank."""
    shape = tensor.shape if hasattr(tensor, "shape") else np.shape(tensor)
    if getattr(shape, "rank", 0) is None:
        return None
    return tuple(shape)


def check_segment_ids(name, ids, batch=None, length=None, runs=False, of="the inputs"):
    """`ids` as an int32 `(batch, length)` tensor of document ids, else a `ValueError` naming `name`.

    What a document is, and so what ids are valid, is `keras_attn.core.segments.DOCUMENTS`: integers
    (float ids would compare unequal after rounding), rank 2 (another rank has no token axis), the
    `batch` and `length` of the inputs (`of`, named in the error) where both are known, and, when the values are known
    (eager), each in `[0, 2**31 - 1]` (a negative id is no document, an int64 id past int32 would
    wrap on the cast). With `runs` (a surface that reads a document as a span of its row) each
    document is one contiguous run of tokens. Symbolic ids (a graph, XLA) are checked by shape only.

    >>> check_segment_ids("segment_ids", [[1, 1, 2, 2, 1]], runs=True)
    Traceback (most recent call last):
    ...
    ValueError: `segment_ids` must give each document one contiguous run of tokens (keras_attn.core.segments.DOCUMENTS). Received: segment_ids=[1, 1, 2, 2, 1] (row 0), where id 1 appears in 2 runs
    """
    if not hasattr(ids, "shape") or not hasattr(ids, "dtype"):
        ids = keras.ops.convert_to_tensor(ids)
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if "int" not in dtype:
        raise ValueError(f"`{name}` must be integer document ids (0 for padding). Received: {name}.dtype={dtype}")
    shape = tuple(ids.shape)
    if len(shape) != 2:
        raise ValueError(f"`{name}` must have rank 2 `(batch, length)`. Received: {name}.shape={shape}")
    for size, expected in ((shape[0], batch), (shape[1], length)):
        if size is not None and expected is not None and size != expected:
            raise ValueError(
                f"`{name}` must have one id per token ({length}) of {of}, in each of its rows ({batch}). "
                f"Received: {name}.shape={shape}"
            )
    values = _known_values(ids)
    if values is not None:
        _check_document_values(name, values, runs)
    return keras.ops.cast(ids, "int32")


def _known_values(tensor):
    """The NumPy values of an eager tensor, `None` for a symbolic one (a graph's, XLA's)."""
    try:
        return np.asarray(keras.ops.convert_to_numpy(tensor))
    except Exception:  # symbolic: its values are known only at run time
        return None


def _check_document_values(name, values, runs):
    bad = values[(values < 0) | (values > MAX_ELEMENTS)]
    if bad.size:
        shown = ", ".join(str(value) for value in sorted(set(bad.tolist()))[:5])
        raise ValueError(
            f"`{name}` must hold ids in [0, {MAX_ELEMENTS}] (0 for padding, 1, 2, ... documents). "
            f"Received: {name} holding {shown}"
        )
    if not runs:
        return
    for row_index, row in enumerate(values):
        starts = np.concatenate([[True], row[1:] != row[:-1]])
        run_ids = row[starts & (row != 0)]
        ids, counts = np.unique(run_ids, return_counts=True)
        if np.any(counts > 1):
            shown = row.tolist() if row.size <= 16 else f"{row[:16].tolist()}..."
            raise ValueError(
                f"`{name}` must give each document one contiguous run of tokens (keras_attn.core.segments.DOCUMENTS). "
                f"Received: {name}={shown} (row {row_index}), where id {ids[counts > 1][0]} appears in "
                f"{counts[counts > 1][0]} runs"
            )


def check_tensor(name, value, *, dtype, rank, shape=None, at_least=None, at_most=None):
    """`value` as a tensor if its dtype kind (`"int"`, `"float"`, `"bool"`, or a tuple of them) and rank
    are the expected ones and its sizes match `shape` (a tuple, `None` for any size, the same
    rank), else a `ValueError` naming `name`, what was expected and what was received. When its
    values are known (eager), `at_least` refuses smaller values and `at_most` larger ones.

    >>> check_tensor("lengths", [3.0, 2.0], dtype="int", rank=1)
    Traceback (most recent call last):
    ...
    ValueError: `lengths` must be a tensor of dtype int and rank 1. Received: lengths.dtype=float32, lengths.shape=(2,)
    """
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        value = keras.ops.convert_to_tensor(value)
    kinds = (dtype,) if isinstance(dtype, str) else dtype
    received = keras.backend.standardize_dtype(value.dtype)
    kind = "bool" if received == "bool" else "int" if "int" in received else "float" if "float" in received else None
    sizes = tuple(value.shape)
    expected = shape if shape is not None else (None,) * rank
    if (
        kind not in kinds
        or len(sizes) != rank
        or any(a is not None and b is not None and a != b for a, b in zip(sizes, expected))
    ):
        wanted = f"a tensor of dtype {' or '.join(kinds)} and rank {rank}"
        if shape is not None:
            wanted += f" and shape {tuple(shape)}"
        raise ValueError(f"`{name}` must be {wanted}. Received: {name}.dtype={received}, {name}.shape={sizes}")
    bounds = [] if at_least is None else [(lambda values: values < at_least, f">= {at_least}")]
    bounds += [] if at_most is None else [(lambda values: values > at_most, f"<= {at_most}")]
    values = _known_values(value) if bounds else None
    for outside_of, bound in bounds if values is not None else ():
        outside = outside_of(values)
        if np.any(outside):
            shown = ", ".join(str(number) for number in sorted(set(values[outside].tolist()))[:5])
            raise ValueError(f"`{name}` must be {bound}. Received: {name} holding {shown}")
    return value
