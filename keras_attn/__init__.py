"""keras_attn: attention layers for TensorFlow/Keras 3."""

import keras_attn.backend  # noqa: F401  first: under another Keras backend, it raises naming it
from keras_attn import attention_families
from keras_attn import ops
from keras_attn import packing
from keras_attn import patterns
from keras_attn.blocks.attention_pooling import AttentionPooling
from keras_attn.blocks.feed_forward import FeedForward
from keras_attn.blocks.masked_global_pooling import MaskedGlobalPooling
from keras_attn.blocks.transformer_decoder import TransformerDecoder
from keras_attn.blocks.transformer_encoder import TransformerEncoder
from keras_attn.core.masks import causal_mask
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import sliding_window_mask
from keras_attn.core.segments import document_positions
from keras_attn.core.softmax import masked_softmax
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.dispatch.cost_model import explain_implementation
from keras_attn.dispatch.cost_model import set_measured_dispatch
from keras_attn.dispatch.tuning import tune
from keras_attn.families.linear_attention import LinearAttention
from keras_attn.families.linformer_attention import LinformerSelfAttention
from keras_attn.families.lsh_attention import LSHSelfAttention
from keras_attn.layers.causal_self_attention import CausalSelfAttention
from keras_attn.layers.conversion import convert
from keras_attn.layers.cross_attention import CrossAttention
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.self_attention import SelfAttention
from keras_attn.ops.keras_flash import disable
from keras_attn.ops.keras_flash import enable
from keras_attn.positions.alibi import ALiBi
from keras_attn.positions.position_embedding import PositionEmbedding
from keras_attn.positions.relative_position_bias import RelativePositionBias
from keras_attn.positions.rotary_embedding import RotaryEmbedding
from keras_attn.positions.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.positions.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.version import __version__

__all__ = [
    "ALiBi",
    "AttentionPooling",
    "CausalSelfAttention",
    "CrossAttention",
    "FeedForward",
    "LSHSelfAttention",
    "LinearAttention",
    "LinformerSelfAttention",
    "MaskedGlobalPooling",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "SelfAttention",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "TransformerDecoder",
    "TransformerEncoder",
    "attention_families",
    "causal_mask",
    "convert",
    "disable",
    "document_positions",
    "enable",
    "explain_implementation",
    "masked_softmax",
    "merge_masks",
    "ops",
    "packing",
    "patterns",
    "scaled_dot_product_attention",
    "set_measured_dispatch",
    "sliding_window_mask",
    "tune",
    "__version__",
]

from keras_attn import contracts as _contracts  # noqa: E402 (wraps the surfaces imported above)

_contracts.enforce()
