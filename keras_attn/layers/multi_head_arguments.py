"""The constructor argument checks of `MultiHeadAttention`, before Keras's own constructor runs.

Keras checks `num_heads`, `key_dim` and `value_dim` itself but takes `True` for 1, and leaves the
other arguments to fail later, or never; each check here raises a `ValueError` naming the
argument, with the value received.
"""

import numbers

import numpy as np

from keras_attn import patterns
from keras_attn.core.attention import ATTENTION_IMPLEMENTATIONS
from keras_attn.validation import check_bool
from keras_attn.validation import check_choice
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_projection_sizes
from keras_attn.validation import check_rate
from keras_attn.validation import check_scale


def checked_pattern(
    *,
    num_heads,
    key_dim,
    value_dim,
    dropout,
    use_bias,
    output_shape,
    attention_axes,
    sliding_window,
    flash_attention,
    use_gate,
    num_key_value_heads,
    implementation,
    scale,
    hard,
    attention_pattern,
):
    """Checks every argument; returns `attention_pattern` as a `keras_attn.patterns.Pattern` (or `None`)."""
    for name, size in (("num_heads", num_heads), ("key_dim", key_dim), ("value_dim", value_dim)):
        if isinstance(size, (bool, np.bool_)):
            raise ValueError(f"Invalid argument `{name}`: a positive integer, not a boolean. Received: {name}={size!r}")
        if isinstance(size, numbers.Integral) and size > 0:  # Keras refuses the others in its own words
            check_positive_int(name, size)
    if all(isinstance(size, numbers.Integral) for size in (num_heads, key_dim, value_dim or key_dim)):
        check_projection_sizes(num_heads, key_dim, value_dim or key_dim)
    check_positive_int("sliding_window", sliding_window, allow_none=True)
    check_rate("dropout", dropout)
    check_scale(scale)
    for name, flag in (("hard", hard), ("use_bias", use_bias), ("use_gate", use_gate)):
        check_bool(name, flag)
    check_bool("flash_attention", flash_attention, allow_none=True)
    if isinstance(attention_axes, (list, tuple)) and not attention_axes:
        raise ValueError(
            f"`attention_axes` must be None, an int or a non-empty sequence of ints. Received: attention_axes={attention_axes!r}"
        )
    attention_pattern = patterns.get(attention_pattern, "attention_pattern")
    check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
    if num_key_value_heads is not None and isinstance(num_heads, int) and num_heads % num_key_value_heads:
        raise ValueError(
            "`num_key_value_heads` must divide `num_heads`. Received: "
            f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
        )
    check_choice("implementation", implementation, ATTENTION_IMPLEMENTATIONS)
    trailing = (output_shape,) if isinstance(output_shape, int) else output_shape
    if isinstance(trailing, (list, tuple)) and not all(isinstance(d, int) and d > 0 for d in trailing):
        raise ValueError(
            f"Invalid `output_shape`: its sizes must be positive ints. Received: output_shape={output_shape}"
        )
    return attention_pattern
