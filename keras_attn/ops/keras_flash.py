"""`enable()`: Keras's own flash-attention switch, on the TensorFlow backend, runs keras_attn's streaming kernel.

Keras's TensorFlow backend raises `"Flash attention is not supported in tensorflow backend."` for
`keras.ops.dot_product_attention(..., flash_attention=True)` and treats `flash_attention=None`
(what `keras.layers.MultiHeadAttention` passes while `keras.config.enable_flash_attention()`
is in force, Keras's default) as `False`. `keras.ops.dot_product_attention` calls the backend's
function through the module attribute `keras.src.backend.nn.dot_product_attention` at each call,
so replacing that one attribute routes the op, its symbolic `Operation` and every layer that uses
it. That attribute is reached through `keras_attn.keras_internals`, the one module that touches
Keras's internals: `tests/test_keras_flash.py` checks, against the pinned Keras, that the attribute it replaces is
what `keras.ops.dot_product_attention` calls.

After `enable()`, a call goes to `keras_attn.ops.dot_product_attention(..., flash_attention=True)`
when Keras would try flash attention: `flash_attention=True`, or `None` while
`keras.config.is_flash_attention_enabled()` is not `False`. `flash_attention=False` (and
`keras.config.disable_flash_attention()` for Keras's layers) keeps Keras's own path. `disable()`
puts Keras's function back. Both are idempotent. The routed op returns what Keras's returns wherever
Keras defines a result, a query whose keys are all masked included (the mean of the values:
`keras_attn.ops.nn`), with the same gradients; anything but a bool or `None` as `flash_attention`
is a `ValueError`.
"""

import keras

from keras_attn import keras_internals
from keras_attn.ops.nn import dot_product_attention
from keras_attn.validation import check_bool

_KERAS_FUNCTION = {}  # "original": Keras's backend function while ours is in its place


def _backend_nn():
    """The TensorFlow backend's `nn` module, whose `dot_product_attention` Keras's op calls (the one
    backend keras_attn imports under: `keras_attn.backend`)."""
    return keras_internals.tensorflow_backend_nn()


def enable():
    """Routes Keras's flash attention on the TensorFlow backend to keras_attn's streaming kernel.

    Afterwards `keras.ops.dot_product_attention(..., flash_attention=True)` runs
    `keras_attn.ops.dot_product_attention(..., flash_attention=True)` (memory linear in the
    length, with gradients) instead of raising, and so does `flash_attention=None` unless
    `keras.config.disable_flash_attention()` was called: `keras.layers.MultiHeadAttention` layers
    (without attention dropout, not returning their scores) and KerasHub layers built on them use
    it. Calling it again changes nothing; `disable()` restores Keras's function.

    Example:

    >>> q = k = v = keras.random.normal((1, 300, 2, 8))
    >>> enable()
    >>> tuple(keras.ops.dot_product_attention(q, k, v, is_causal=True, flash_attention=True).shape)
    (1, 300, 2, 8)
    >>> disable()
    """
    module = _backend_nn()
    if module.dot_product_attention is not routed_dot_product_attention:
        _KERAS_FUNCTION["original"] = module.dot_product_attention
        module.dot_product_attention = routed_dot_product_attention


def disable():
    """Puts Keras's own TensorFlow `dot_product_attention` back (its flash attention raises again).

    Example:

    >>> enable()
    >>> disable()
    >>> is_enabled()
    False
    """
    module = _backend_nn()
    if module.dot_product_attention is routed_dot_product_attention:
        module.dot_product_attention = _KERAS_FUNCTION.pop("original")


def is_enabled():
    """Whether `enable()` is in force."""
    return _backend_nn().dot_product_attention is routed_dot_product_attention


def wants_flash(flash_attention):
    """Whether Keras would try flash attention for this `flash_attention` argument: `True`, or
    `None` while Keras's global switch is not off. Anything but a bool or `None` is a `ValueError`
    (Keras's signature: a truthy string is not a choice).

    >>> wants_flash("no")
    Traceback (most recent call last):
    ...
    ValueError: argument `flash_attention` must be True, False or None. Received: flash_attention='no'
    """
    check_bool("flash_attention", flash_attention, allow_none=True)
    if flash_attention is None:
        return keras.config.is_flash_attention_enabled() is not False
    return bool(flash_attention)


def routed_dot_product_attention(query, key, value, flash_attention=None, **options):
    """The TensorFlow backend's `dot_product_attention` while `enable()` is in force (Keras passes
    `bias`, `mask`, `scale`, `is_causal` and `attn_logits_soft_cap` by keyword: `options`)."""
    if wants_flash(flash_attention):
        return dot_product_attention(query, key, value, flash_attention=True, **options)
    return _KERAS_FUNCTION["original"](query, key, value, flash_attention=flash_attention, **options)
