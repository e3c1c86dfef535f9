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


def check_number(name, value, *, above=None, at_least=None, below=None, integer=False, allow_none=False):
    """`value` if it is a finite real number (an integer if `integer`) within the bounds, else a
    `ValueError` naming `name`.

    >>> check_number("rate", 0.5, at_least=0, below=1)
    0.5
    >>> check_number("max_wavelength", float("nan"), above=1)
    Traceback (most recent call last):
    ...
    ValueError: `max_wavelength` must be a finite number > 1. Received: max_wavelength=nan
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
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return value


def check_positive_int(name, value, allow_none=False):
    """`value` if it is an int in `[1, MAX_ELEMENTS]` (or an allowed `None`), else a `ValueError` naming `name`.

    >>> check_positive_int("num_heads", 2**40)
    Traceback (most recent call last):
    ...
    ValueError: `num_heads` must be a positive integer <= 2147483647 (2**31 - 1). Received: num_heads=1099511627776
    """
    if value is None and allow_none:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or not 0 < value <= MAX_ELEMENTS:
        expected = f"a positive integer <= {MAX_ELEMENTS} (2**31 - 1)" + (" or None" if allow_none else "")
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
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
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={rate!r}")
    return rate


def check_bool(name, value, allow_none=False):
    """`value` if it is a real boolean (Python or NumPy), else a `ValueError` naming `name`.

    >>> check_bool("causal", "no")
    Traceback (most recent call last):
    ...
    ValueError: `causal` must be True or False. Received: causal='no'
    """
    if value is None and allow_none:
        return value
    if not isinstance(value, (bool, np.bool_)):
        expected = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return bool(value)


def check_choice(name, value, choices):
    """`value` if it is one of `choices`, else a `ValueError` naming `name` and the choices."""
    if isinstance(value, (bool, np.bool_)) or value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}. Received: {name}={value!r}")
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
        raise ValueError(f"`scale` must be positive and at most {FLOAT32_MAX} (float32). Received: scale={scale!r}")
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not 0 < scale <= FLOAT32_MAX:
        raise ValueError(
            f"`scale` must be a positive finite number or None, at most {FLOAT32_MAX} (the largest float32: "
            f"the logits are computed in float32). Received: scale={scale!r}"
        )
    return scale


def check_soft_cap(soft_cap, name="logit_soft_cap"):
    """`soft_cap` if it is `None` or a positive finite number, else a `ValueError` naming `name`.

    >>> check_soft_cap(50.0)
    50.0
    """
    if soft_cap is None:
        return soft_cap
    if isinstance(soft_cap, (bool, np.bool_)) or not isinstance(soft_cap, numbers.Real) or not 0 < soft_cap < math.inf:
        raise ValueError(f"`{name}` must be a positive finite number or None. Received: {name}={soft_cap!r}")
    return soft_cap


def check_position(name, value):
    """`value` if the position (or length) is an int >= 0 or an integer tensor, else a `ValueError`:
    a float would give fractional positions, a negative int positions before the sequence."""
    if isinstance(value, numbers.Number) or not hasattr(value, "dtype"):
        valid = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= 0
    else:
        valid = "int" in keras.backend.standardize_dtype(value.dtype)
    if not valid:
        raise ValueError(f"`{name}` must be an int >= 0 or an integer tensor. Received: {name}={value!r}")
    return value


def check_segment_ids(name, ids):
    """`ids` as an int32 `(batch, length)` tensor of document ids (`keras_attn.core.segments`), else a
    `ValueError`: float ids would compare unequal after rounding, another rank has no token axis."""
    if not hasattr(ids, "shape") or not hasattr(ids, "dtype"):
        ids = keras.ops.convert_to_tensor(ids)
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if "int" not in dtype:
        raise ValueError(f"`{name}` must be integer document ids (0 for padding). Received: {name}.dtype={dtype}")
    if len(ids.shape) != 2:
        raise ValueError(f"`{name}` must have rank 2 `(batch, length)`. Received: {name}.shape={tuple(ids.shape)}")
    return keras.ops.cast(ids, "int32")
