"""The blocking of one blockwise attention call (`keras_attn.kernels.blockwise`): block sizes, which
key blocks each query block reaches under the pattern and the documents of packed rows (and the
reverse, for the backward pass), each block's mask and slice of a mask or bias, and the grid of a
bias's gradient blocks.
"""

import dataclasses

import keras
import tensorflow as tf

from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import pattern_mask
from keras_attn.core.position_bias import block_positions
from keras_attn.kernels import steps
from keras_attn.kernels import streaming_softmax

# Default block sizes grow with the length (about 16 blocks per axis) between these bounds:
# small blocks skip more of a causal matrix at short lengths (128 was fastest at length 512 in
# benchmarks/layer_throughput.py); large ones keep the per-block loop overhead low at long lengths.
MIN_DEFAULT_BLOCK_SIZE = 128
MAX_DEFAULT_BLOCK_SIZE = 1024


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """Static blocking of one attention call; lengths may be tensors when shapes are dynamic."""

    query_len: object
    key_len: object
    query_block: int
    key_block: int
    pattern: object
    query_offset: object
    dropout_rate: float
    position_bias: object = None
    has_bias: bool = False
    documents: object = None  # keras_attn.kernels.document_blocks.DocumentBlocks of packed rows, or None
    soft_cap: object = None  # a logit soft cap (keras_attn.core.softmax.soft_capped), or None

    @property
    def has_any_bias(self):
        """Whether the logits get an additive bias (`bias=` or a position bias)."""
        return self.has_bias or self.position_bias is not None

    def positions(self, query_block, key_block):
        """The query and key positions of block `(query_block, key_block)`, for its position bias."""
        return (
            block_positions(self.query_offset + query_block * self.query_block, self.query_block),
            block_positions(key_block * self.key_block, self.key_block),
        )

    @property
    def num_query_blocks(self):
        return (self.query_len + self.query_block - 1) // self.query_block

    @property
    def num_key_blocks(self):
        return (self.key_len + self.key_block - 1) // self.key_block

    @property
    def padded_query_len(self):
        return self.num_query_blocks * self.query_block

    @property
    def padded_key_len(self):
        return self.num_key_blocks * self.key_block

    @property
    def pads_keys(self):
        return not isinstance(self.key_len, int) or self.key_len % self.key_block != 0

    def block_unmasked(self, query_block, key_block):
        """Whether neither the pattern nor key padding masks any pair of block `(query_block, key_block)`."""
        first_row = self.query_offset + query_block * self.query_block
        last_row = first_row + self.query_block - 1
        first_col = key_block * self.key_block
        last_col = first_col + self.key_block - 1
        unmasked = tf.constant(True)
        if self.pads_keys:
            unmasked = tf.logical_and(unmasked, last_col < self.key_len)
        if self.pattern is not None:
            unmasked = tf.logical_and(unmasked, self.pattern.block_full(first_row, last_row, first_col, last_col))
        if self.documents is not None:
            unmasked = tf.logical_and(unmasked, self.documents.single[query_block, key_block])
        return unmasked

    def key_blocks_for(self, query_block):
        """`[start, stop)` of the key blocks query chunk `query_block` can attend to."""
        start, stop = 0, self.num_key_blocks
        if self.pattern is not None:
            first_row = self.query_offset + query_block * self.query_block
            start, stop = self.pattern.key_range(first_row, first_row + self.query_block - 1, self.padded_key_len)
            start, stop = start // self.key_block, (stop + self.key_block - 1) // self.key_block
        if self.documents is None:
            return start, stop
        return _intersection((start, stop), self.documents.key_blocks_for(query_block))

    def query_blocks_for(self, key_block):
        """`[start, stop)` of the query chunks that can attend to key block `key_block`."""
        start, stop = 0, self.num_query_blocks
        if self.pattern is not None:
            first_col = key_block * self.key_block
            first_query = self.query_offset
            start, stop = self.pattern.query_range(
                first_col, first_col + self.key_block - 1, first_query, first_query + self.padded_query_len
            )
            start, stop = (
                (start - first_query) // self.query_block,
                (stop - first_query + self.query_block - 1) // self.query_block,
            )
        if self.documents is None:
            return start, stop
        return _intersection((start, stop), self.documents.query_blocks_for(key_block))


def _intersection(left, right):
    """The intersection of two `[start, stop)` ranges (empty when `start >= stop`)."""
    return tf.maximum(left[0], right[0]), tf.minimum(left[1], right[1])


def length(tensor):
    static = tensor.shape[1]
    return static if static is not None else tf.shape(tensor)[1]


def default_block_size(length):
    if not isinstance(length, int):
        return MIN_DEFAULT_BLOCK_SIZE
    target = 2 ** max(0, (length // 16 - 1).bit_length())  # power of two >= length / 16
    return min(MAX_DEFAULT_BLOCK_SIZE, max(MIN_DEFAULT_BLOCK_SIZE, target))


def clamp_block(block, length):
    return min(block, length) if isinstance(length, int) and length > 0 else block


def to_blocks_layout(tensor, padding):
    tensor = tf.transpose(tensor, (0, 2, 1, 3))  # (batch, heads, seq, depth)
    return tf.pad(tensor, [[0, 0], [0, 0], [0, padding], [0, 0]])  # (batch, heads, padded, depth)


def pad_pairwise(tensor, plan, value):
    """Pads the non-broadcast query/key axes of a `(batch?, heads?, q?, k?)` tensor to whole blocks."""
    query_pad = 0 if tensor.shape[2] == 1 else plan.padded_query_len - plan.query_len
    key_pad = 0 if tensor.shape[3] == 1 else plan.padded_key_len - plan.key_len
    return tf.pad(tensor, [[0, 0], [0, 0], [0, query_pad], [0, key_pad]], constant_values=value)


def pairwise_block(tensor, plan, query_block, key_block):
    """Block `(query_block, key_block)` of a `(batch?, heads?, q?, k?)` mask or bias."""
    query_full, key_full = tensor.shape[2] != 1, tensor.shape[3] != 1
    begin = tf.stack(
        [
            0,
            0,
            query_block * plan.query_block if query_full else 0,
            key_block * plan.key_block if key_full else 0,
        ]
    )
    size = [-1, -1, plan.query_block if query_full else 1, plan.key_block if key_full else 1]
    return tf.slice(tensor, begin, size)


def block_mask(plan, mask, query_block, key_block):
    """Boolean `(batch?, heads?, query_block, key_block)` mask of one block (some mask reaches it)."""
    first_col = key_block * plan.key_block
    block_mask = pattern_mask(
        None if mask is None else pairwise_block(mask, plan, query_block, key_block),
        plan.pattern,
        plan.query_block,
        plan.key_block,
        query_offset=plan.query_offset + query_block * plan.query_block,
        key_offset=first_col,
    )
    if plan.pads_keys:
        cols = first_col + tf.range(plan.key_block)  # (key_block,)
        block_mask = merge_masks(block_mask, tf.reshape(cols < plan.key_len, (1, 1, 1, plan.key_block)))
    if plan.documents is not None:
        block_mask = merge_masks(
            block_mask, plan.documents.block_mask(query_block, key_block, plan.query_block, plan.key_block)
        )
    return block_mask


def bias_grid(plan, bias):
    """Blocks of the bias gradient along the query and key axes (1 where the bias broadcasts)."""
    query_full, key_full = bias.shape[2] != 1, bias.shape[3] != 1
    return (
        plan.num_query_blocks if query_full else 1,
        plan.num_key_blocks if key_full else 1,
        plan.query_block if query_full else 1,
        plan.key_block if key_full else 1,
    )


def zero_bias_grad_blocks(plan, bias):
    """A TensorArray of zero bias-gradient blocks, one per (query block, key block) of the grid."""
    rows, cols, block_rows, block_cols = bias_grid(plan, bias)
    batch, heads = keras.ops.shape(bias)[:2]
    zeros = tf.zeros(tf.stack([rows * cols, batch, heads, block_rows, block_cols]), bias.dtype)
    return steps.step_array(bias, rows * cols, block_rows, block_cols).unstack(zeros)


def accumulate_bias_grad(plan, bias, bias_grads, query_block, key_block, logits_grad):
    """Adds one block's logits gradient, summed over the bias's broadcast axes, to its grid cell."""
    logits_grad = streaming_softmax.broadcast_bias_gradient(bias, logits_grad)
    _, cols, _, _ = bias_grid(plan, bias)
    row = query_block if bias.shape[2] != 1 else 0
    col = key_block if bias.shape[3] != 1 else 0
    cell = row * cols + col
    return bias_grads.write(cell, bias_grads.read(cell) + logits_grad)


def unblock_bias_grad(plan, bias, blocks):
    """`(rows * cols, batch?, heads?, block_rows, block_cols)` grid -> the padded bias's shape."""
    rows, cols, block_rows, block_cols = bias_grid(plan, bias)
    batch, heads = keras.ops.shape(bias)[:2]
    grid = tf.reshape(blocks, tf.stack([rows, cols, batch, heads, block_rows, block_cols]))
    grid = tf.transpose(grid, (2, 3, 0, 4, 1, 5))  # (batch?, heads?, rows, block_rows, cols, block_cols)
    return tf.reshape(grid, tf.shape(bias))
