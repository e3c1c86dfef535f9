"""Attention ops with Keras's signatures (`dot_product_attention`), and `enable()` / `disable()`,
which route Keras's own flash-attention switch on the TensorFlow backend to them."""

from keras_attn.ops.keras_flash import disable
from keras_attn.ops.keras_flash import enable
from keras_attn.ops.keras_flash import is_enabled
from keras_attn.ops.nn import dot_product_attention

__all__ = ["disable", "dot_product_attention", "enable", "is_enabled"]
