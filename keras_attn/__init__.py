"""keras_attn: attention layers for TensorFlow/Keras 3."""

from keras_attn.attention import causal_mask
from keras_attn.attention import masked_softmax
from keras_attn.attention import merge_masks
from keras_attn.attention import scaled_dot_product_attention
from keras_attn.attention import sliding_window_mask
from keras_attn.multi_head_attention import MultiHeadAttention

__version__ = "0.1.0"
