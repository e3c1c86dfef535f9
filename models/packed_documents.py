"""Reading documents back out of packed rows (`pipelines.batching.pack_documents`).

A packed batch keeps its documents: `token_index` (or the masked positions mapped through it)
gives the place of each document token in the flattened rows, so what follows the encoder
(pooling per document, the masked-token head) sees each document's hidden states in the layout
of the padded batch, and the labels and losses stay those of the padded batch.
"""

import keras
from keras import ops

from models.serialization import register_serializable

# The packed inputs of a model reading packed rows, as `pack_documents` names them.
PACKED_IDS, SEGMENT_IDS, TOKEN_INDEX = "packed_ids", "segment_ids", "token_index"


@register_serializable()
class GatherTokens(keras.layers.Layer):
    """`hidden (rows, row_length, dim)`, `index (documents, tokens)` int -> `(documents, tokens, dim)`:
    the hidden states at `index` in the flattened rows (`row * row_length + column`). Its output
    carries no mask (the caller knows which of `index` are real)."""

    def call(self, hidden, index):
        flat = ops.reshape(hidden, (-1, ops.shape(hidden)[-1]))  # (rows * row_length, dim)
        return ops.take(flat, ops.cast(index, "int32"), axis=0)

    def compute_mask(self, hidden, index, mask=None):
        return None

    def compute_output_shape(self, hidden_shape, index_shape):
        return (*index_shape, hidden_shape[-1])
