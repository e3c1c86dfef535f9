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
    """`value` if it is an int >= 1 (or an allowed `None`), else a `ValueError` naming `name`."""
    if value is None and allow_none:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value <= 0:
        expected = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")
    return value


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


def check_scale(scale):
    """`scale` if the inverse temperature is `None` or positive and finite, else a `ValueError`.

    A tensor is checked by value when its value is known (eager); a symbolic tensor passes.
    """
    if scale is None:
        return scale
    if hasattr(scale, "dtype") and not isinstance(scale, numbers.Real):
        try:
            values = np.asarray(keras.ops.convert_to_numpy(scale), dtype="float64")
        except Exception:  # symbolic: its value is known only at run time
            return scale
        if values.size and np.all(np.isfinite(values)) and np.all(values > 0):
            return scale
        raise ValueError(f"`scale` must be positive and finite. Received: scale={scale!r}")
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
        raise ValueError(f"`scale` must be a positive finite number or None. Received: scale={scale!r}")
    return scale


def check_position(name, value):
    """`value` if the position is an int >= 0 or an integer tensor, else a `ValueError`: a float
    would give fractional positions, a negative int positions before the sequence."""
    if isinstance(value, numbers.Number) or not hasattr(value, "dtype"):
        valid = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= 0
    else:
        valid = "int" in keras.backend.standardize_dtype(value.dtype)
    if not valid:
        raise ValueError(f"`{name}` must be an int >= 0 or an integer tensor. Received: {name}={value!r}")
    return value
