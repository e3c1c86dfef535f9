"""The constructor argument checks of `MultiHeadAttention`, before Keras's own constructor runs.

Keras checks `num_heads`, `key_dim` and `value_dim` itself from 3.15 on (an older Keras takes any
value) but takes `True` for 1, and leaves the other arguments to fail later, or never; each check
here raises a `ValueError` naming the argument, with the value received (the sizes in Keras 3.15's
words, whatever the Keras).
"""

import numbers

import numpy as np

from keras_attn import patterns
from keras_attn.dispatch.attention import ATTENTION_IMPLEMENTATIONS
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
        if size is None and name == "value_dim":
            continue
        if not (isinstance(size, numbers.Integral) and size > 0):
            expected = "a positive integer" + (" or `None`" if name == "value_dim" else "")
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected {expected}. Received: {name}={size!r}"
            )
        check_positive_int(name, size)
    if all(isinstance(size, numbers.Integral) for size in (num_heads, key_dim, value_dim or key_dim)):
        check_projection_sizes(num_heads, key_dim, value_dim or key_dim)
    check_positive_int("sliding_window", sliding_window, allow_none=True)
    check_rate("dropout", dropout)
    check_scale(scale)
    for name, flag in (("hard", hard), ("use_bias", use_bias), ("use_gate", use_gate)):
        check_bool(name, flag)
    check_bool("flash_attention", flash_attention, allow_none=True)
    _check_attention_axes(attention_axes)
    attention_pattern = patterns.get(attention_pattern, "attention_pattern")
    check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
    if num_key_value_heads is not None and isinstance(num_heads, int) and num_heads % num_key_value_heads:
        raise ValueError(
            "`num_key_value_heads` must divide `num_heads`. Received: "
            f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
        )
    check_choice("implementation", implementation, ATTENTION_IMPLEMENTATIONS)
    _check_flash_attention(flash_attention, implementation, hard)
    trailing = (output_shape,) if isinstance(output_shape, int) else output_shape
    if isinstance(trailing, (list, tuple)) and not all(isinstance(d, int) and d > 0 for d in trailing):
        raise ValueError(
            f"Invalid `output_shape`: its sizes must be positive ints. Received: output_shape={output_shape}"
        )
    return attention_pattern


def _check_attention_axes(attention_axes):
    """None, an int, or a non-empty list or tuple of distinct ints (a float or repeated axis names no
    attention axis Keras's einsum can build)."""
    if attention_axes is None or _is_int(attention_axes):
        return
    if (
        not isinstance(attention_axes, (list, tuple))
        or not attention_axes
        or not all(map(_is_int, attention_axes))
        or len(set(attention_axes)) != len(attention_axes)
    ):
        raise ValueError(
            "`attention_axes` must be None, an int or a non-empty sequence of distinct ints. "
            f"Received: attention_axes={attention_axes!r}"
        )


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


# The kernels that never hold a query's weights over every key at once (memory linear in the
# length); dense holds them all, chunked a chunk of queries' weights over all their keys at a time.
FLASH_IMPLEMENTATIONS = ("blockwise", "strided")


def _check_flash_attention(flash_attention, implementation, hard):
    """`flash_attention=True` must name a kernel of `FLASH_IMPLEMENTATIONS` (or `"auto"`), `False`
    the dense one (or `"auto"`); hard attention has only the dense kernel."""
    if flash_attention is None:
        return
    if flash_attention and hard:
        raise ValueError(
            "`flash_attention=True` never materialises the attention matrix, which hard (argmax) "
            "attention needs (it runs on the dense kernel). Received: flash_attention=True, hard=True"
        )
    if implementation == "auto":
        return
    if flash_attention and implementation not in FLASH_IMPLEMENTATIONS:
        raise ValueError(
            "`flash_attention=True` needs a kernel that never materialises the attention matrix, "
            f"`implementation` one of {('auto', *FLASH_IMPLEMENTATIONS)}. "
            f"Received: flash_attention=True, implementation={implementation!r}"
        )
    if not flash_attention and implementation != "dense":
        raise ValueError(
            "`flash_attention=False` runs the dense kernel, `implementation` 'auto' or 'dense'. "
            f"Received: flash_attention=False, implementation={implementation!r}"
        )


def kernel_name(flash_attention, implementation):
    """The `implementation` the core runs for the layer's `flash_attention` and `implementation`
    (checked together by `checked_pattern`): `"auto"` becomes blockwise under `flash_attention=True`,
    dense under `False`."""
    if implementation != "auto" or flash_attention is None:
        return implementation
    return FLASH_IMPLEMENTATIONS[0] if flash_attention else "dense"


def check_scores_allowed(flash_attention, return_attention_scores):
    """Keras's refusal of `return_attention_scores=True` under `flash_attention=True`."""
    if flash_attention and return_attention_scores:
        raise ValueError(
            "Returning attention scores is not supported when flash attention is enabled. Please "
            "disable flash attention to access attention scores. Received: flash_attention=True, "
            "return_attention_scores=True"
        )
