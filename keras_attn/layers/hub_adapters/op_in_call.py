"""The adapter of KerasHub attention layers that call `keras.ops.dot_product_attention` in their own `call`.

ESM's, RoFormer V2's and DINOv3's attention have no `_compute_attention` hook: their `call`
projects, applies the rotary embedding and calls Keras's op directly (which on TensorFlow is
Keras's dense path). The adapted `call` is the layer's own, run while Keras's op computes with
`keras_attn.ops.dot_product_attention`: Keras's semantics wherever Keras defines a result (a query
whose keys are all masked, as ESM masks the padded queries, gets the mean of the values), with the
kernel the layer's `implementation` names: `"auto"` (by size), `"dense"` or `"blockwise"` (the
streaming kernel). `"chunked"` and `"strided"` need a causal or windowed pattern, which these
bidirectional layers never declare.

The routing replaces the TensorFlow backend's function (`keras_attn.keras_internals`) for the
duration of the layer's call, as `keras_attn.enable()` does for the whole process: a call of
Keras's op that another thread makes during it runs keras_attn's too.
"""

from keras_attn import keras_internals
from keras_attn.layers.hub_adapters.routing import routed
from keras_attn.ops.nn import dot_product_attention

HOOK = "call"
# The layer's `implementation` -> `flash_attention` of keras_attn.ops.dot_product_attention.
_FLASH_ATTENTION = {"auto": None, "dense": False, "blockwise": True}


def compute_attention(layer, *args, **kwargs):
    """The layer's own `call`, its `keras.ops.dot_product_attention` computed by keras_attn's op."""
    if layer.implementation not in _FLASH_ATTENTION:
        raise ValueError(
            f"`implementation` of the adapted {type(layer).__name__} must be one of {sorted(_FLASH_ATTENTION)}: its "
            f"attention is bidirectional, with no pattern. Received: implementation={layer.implementation!r}"
        )
    kernel = _FLASH_ATTENTION[layer.implementation]

    def attention(query, key, value, flash_attention=None, **options):
        del flash_attention  # the layer's `implementation` chooses the kernel, not Keras's flash switch
        return dot_product_attention(query, key, value, flash_attention=kernel, **options)

    with routed(keras_internals.tensorflow_backend_nn(), "dot_product_attention", attention):
        return super(type(layer), layer).call(*args, **kwargs)


def why_unsupported(layer):
    """Every layer of these classes is supported: `None`."""
    del layer
    return None
