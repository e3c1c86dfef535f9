"""Query-chunked scaled dot-product attention for patterned attention (TensorFlow backend).

The same contract as `keras_attn.dispatch.attention.scaled_dot_product_attention` (masks, patterns, bias,
dropout on the normalised weights, fully masked rows give exactly zero) for attention whose
`keras_attn.patterns` pattern leaves part of the `(query_len, key_len)` matrix out: the queries
run in chunks, and each chunk computes only the keys `pattern.key_range` says it can reach (about
half the work of the dense path under a causal pattern).

The gradient is written out (a `tf.custom_gradient`) instead of being differentiated through the
softmax, as FlashAttention's: nothing pairwise is kept from the forward pass, the backward pass
recomputes each chunk's weights from the inputs (the same ops, so the same weights) one chunk at a
time, and the softmax gradient subtracts `rowsum(dO * O)` (`delta`, a pass over the output) rather
than reducing the product of the weights and their gradient. A training call so holds one chunk's
weights at a time, as a forward call does, for one more `Q K^T` product per chunk: keeping every
chunk's weights instead would hold as much as the dense kernel (the whole matrix under the
pattern) to save that product, and the dense kernel is the one that trades memory for time.

A position bias (`keras_attn.core.position_bias`: ALiBi, T5's relative bias) is computed per chunk
from the chunk's positions, and its parameters get their gradient from each chunk's logits
gradient.

Each chunk holds whole rows. An inverse temperature of at most 1 is folded into the query
(`keras_attn.kernels.streaming_softmax.fold_scale`) and the chunk's softmax is the core's
(`keras_attn.core.softmax`: finite fill, one fused softmax); a larger or tensor one multiplies logits
already shifted by their row maximum (`keras_attn.kernels.streaming_softmax.softmax`, exact up to the
float32 limit). Either way masked keys have weight exactly 0 and rows without keys a zero output.

Packed rows (`query_segment_ids` / `key_segment_ids`, `keras_attn.core.segments`): a query attends
only to keys of its own document, so a row of documents of lengths `n_1 .. n_k` needs only
`sum n_i^2` of its `(sum n_i)^2` pairs. The chunk plan is static (Python ints) while the documents
are data, so the chunk cannot narrow its keys by a data-dependent slice: the slice's length would be
dynamic, which XLA refuses and which every chunk would then have to pad to the worst case anyway.
Instead each chunk cuts its keys into tiles of `KEY_BLOCK_SIZE` (static shapes), and each tile is a
`tf.cond` on whether its queries may share a document with its keys
(`keras_attn.kernels.document_blocks`, from the ids of the tile's own queries and keys): the tiles
that hold a document pair are computed, each with the document mask of its own ids (never the
whole `(query_len, key_len)` mask), and the others are left out, so the logits, exponentials and
products cost about `sum n_i^2` plus the tiles a document boundary cuts. Each computed tile takes a
softmax of its own with its row statistics, the tiles merge into the one softmax of the chunk's rows
(`streaming_softmax.merge`), and each tile's weights are rescaled by its share of the row's sum:
the weights the backward pass recomputes are exactly the row softmax's, and a skipped tile's are
zeros that the backward pass skips by the same `tf.cond`. A `tf.cond` runs eagerly as a Python
branch, and in a graph and under XLA as a conditional whose untaken branch costs nothing; a skipped
tile still writes its zero weights (memory the chunk holds anyway).

Dropout keep-masks are never kept: each tile's mask is drawn from a stateless generator keyed by
the tile (a seed per tile, drawn outside the custom gradient from the seed generator), once in the
forward pass and again, identically, in the backward pass, as the blockwise kernel does.
"""

import dataclasses

import keras
import tensorflow as tf

from keras_attn import patterns
from keras_attn.core.masks import may_empty_rows
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import pattern_mask
from keras_attn.core.position_bias import add_gradients
from keras_attn.core.position_bias import bias_parameter_gradients
from keras_attn.core.position_bias import block_positions
from keras_attn.core.position_bias import check_position_bias
from keras_attn.core.position_bias import read_bias_parameters
from keras_attn.core.position_bias import split_inputs
from keras_attn.core.segments import resolve_segment_ids
from keras_attn.core.segments import segment_mask
from keras_attn.core.softmax import fill_masked
from keras_attn.core.softmax import masked_softmax
from keras_attn.core.softmax import resolved_scale
from keras_attn.kernels import cost
from keras_attn.kernels import document_blocks
from keras_attn.kernels import streaming_softmax
from keras_attn.kernels.call import why_not_tensorflow_streaming
from keras_attn.kernels.call import with_repeated_heads
from keras_attn.utils import float_math_dtype
from keras_attn.validation import check_scale

# Queries per chunk: each chunk computes only the keys its pattern reaches.
QUERY_CHUNK_SIZE = 128
# Keys per tile of a chunk when segment ids are given: the unit a chunk skips.
KEY_BLOCK_SIZE = 128


@dataclasses.dataclass(frozen=True)
class QueryChunk:
    """Queries `[query_start, query_stop)` attend to keys `[key_start, key_stop)` (static ints)."""

    query_start: int
    query_stop: int
    key_start: int
    key_stop: int

    @property
    def has_keys(self):
        return self.key_stop > self.key_start


def why_unsupported(call):
    """Why the chunked kernel cannot take this `AttentionCall` (a message), or `None` when it can."""
    streaming = why_not_tensorflow_streaming(call)
    if streaming:
        return streaming
    query, key = call.query, call.key
    if query.shape[1] is None or key.shape[1] is None:
        return f"static lengths. Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
    if query.shape[1] == 0:  # no chunk to concatenate
        return f"at least one query. Received: query.shape={tuple(query.shape)}"
    if isinstance(call.query_offset, bool) or not isinstance(call.query_offset, int):
        return f"a Python int `query_offset`. Received: query_offset={call.query_offset!r}"
    for name, pairwise in (("mask", call.mask), ("bias", call.bias)):
        if pairwise is not None and None in tuple(pairwise.shape)[2:]:
            return f"`{name}` with static query and key dimensions. Received: {name}.shape={tuple(pairwise.shape)}"
    return None


def attend(call):
    """`chunked_attention` of an `AttentionCall`, in chunks of `QUERY_CHUNK_SIZE` queries, its grouped key/value heads repeated to the query's."""
    call = with_repeated_heads(call)
    return chunked_attention(
        call.query,
        call.key,
        call.value,
        mask=call.mask,
        bias=call.bias,
        pattern=call.pattern,
        query_offset=call.query_offset,
        scale=call.scale,
        dropout_rate=call.dropout_rate,
        seed_generator=call.seed_generator,
        chunk_size=QUERY_CHUNK_SIZE,
        position_bias=call.position_bias,
        query_segment_ids=call.query_segment_ids,
        key_segment_ids=call.key_segment_ids,
        logit_soft_cap=call.logit_soft_cap,
    )


def cost_features(call):
    """The `keras_attn.kernels.cost` features of a call this kernel takes: each chunk computes the
    keys its pattern reaches (in tiles of `KEY_BLOCK_SIZE` keys, one step each, for packed rows);
    the chunks run one after another (`_after`) and hold one chunk's weights at a time, in the forward
    pass and in the backward pass, which recomputes them (a training call computes each chunk's
    pairs twice: one more product, the cost model's training coefficients). The steps are a Python
    loop, unrolled into the graph."""
    _, query_len, key_len, _, _, _ = cost.sizes(call)
    indices, weight = cost.sampled_blocks(-(-query_len // QUERY_CHUNK_SIZE))
    chunks = [
        query_chunk(index, query_len, key_len, QUERY_CHUNK_SIZE, call.pattern, call.query_offset) for index in indices
    ]
    computed = [(chunk.query_stop - chunk.query_start) * (chunk.key_stop - chunk.key_start) for chunk in chunks]
    tile_size = None if call.query_segment_ids is None else KEY_BLOCK_SIZE
    steps = round(weight * sum(tile_count(chunk, tile_size) for chunk in chunks))
    total = weight * sum(computed)
    held = max(computed, default=0)
    return cost.features(call, computed_pairs=total, steps=steps, held_pairs=held, unrolled=True)


def pattern_query_chunks(query_len, key_len, chunk_size, pattern, query_offset=0):
    """Splits the queries into chunks of `chunk_size` and bounds each chunk's keys by `pattern.key_range`.

    Under a causal pattern chunk `i` needs only the keys up to its last query, so the chunks cover
    about half of the `(query_len, key_len)` matrix; a sliding window bounds both ends. Without a
    pattern (`None`) every chunk attends to every key.
    """
    return [
        query_chunk(index, query_len, key_len, chunk_size, pattern, query_offset)
        for index in range(-(-query_len // chunk_size))
    ]


def query_chunk(index, query_len, key_len, chunk_size, pattern, query_offset=0):
    """Chunk `index` of `pattern_query_chunks`: its queries, and the keys the pattern lets them reach."""
    query_start = index * chunk_size
    query_stop = min(query_start + chunk_size, query_len)
    # positions of the chunk's first and last queries among the keys
    key_start, key_stop = (
        (0, key_len)
        if pattern is None
        else pattern.key_range(query_start + query_offset, query_stop - 1 + query_offset, key_len)
    )
    return QueryChunk(query_start, query_stop, key_start, key_stop)


def tile_count(chunk, key_block_size):
    """`len(chunk_tiles(chunk, key_block_size))`, counted without making the tiles."""
    if key_block_size is None or not chunk.has_keys:
        return 1
    return (chunk.key_stop - 1) // key_block_size - chunk.key_start // key_block_size + 1


def chunk_tiles(chunk, key_block_size):
    """The chunk's keys cut at the multiples of `key_block_size` into tiles (`QueryChunk`s of the
    chunk's queries over part of its keys); `None` or a chunk without keys: the chunk itself."""
    if key_block_size is None or not chunk.has_keys:
        return [chunk]
    first_cut = (chunk.key_start // key_block_size + 1) * key_block_size
    bounds = [chunk.key_start, *range(first_cut, chunk.key_stop, key_block_size), chunk.key_stop]
    return [QueryChunk(chunk.query_start, chunk.query_stop, start, stop) for start, stop in zip(bounds, bounds[1:])]


def chunked_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    pattern=None,
    is_causal=False,
    sliding_window=None,
    query_offset=0,
    scale=None,
    dropout_rate=0.0,
    seed_generator=None,
    chunk_size=QUERY_CHUNK_SIZE,
    position_bias=None,
    query_segment_ids=None,
    key_segment_ids=None,
    key_block_size=KEY_BLOCK_SIZE,
    logit_soft_cap=None,
):
    """Attention of `pattern_query_chunks` chunks, each over only the keys its pattern reaches.

    Args:
        query: `(batch, query_len, heads, depth)`, static `query_len`.
        key: `(batch, key_len, heads, depth)`, static `key_len` (key/value heads already
            repeated to the query heads).
        value: `(batch, key_len, heads, value_depth)`.
        mask: optional boolean mask broadcastable to `(batch, heads, query_len, key_len)` with
            static query and key dimensions.
        bias: optional additive bias, same shape rules as `mask`; it receives a gradient.
        pattern: a `keras_attn.patterns.Pattern` or `None`; query `i` sits at position `i + query_offset`.
        is_causal, sliding_window: shorthands intersected with `pattern`
            (`keras_attn.patterns.from_shorthands`); without any, every chunk attends to every key.
        query_offset: Python int position of the first query among the keys.
        scale: the inverse temperature multiplying the logits; `None` (default) for
            `keras_attn.core.softmax.default_scale`, `1 / sqrt(depth)`.
        dropout_rate: dropout on the normalised weights (pass 0 outside training).
        seed_generator: a `keras.random.SeedGenerator` for dropout.
        chunk_size: queries per chunk.
        position_bias: optional `keras_attn.core.position_bias.PositionBias` for the query heads;
            its bias is computed per chunk from positions (query `i` at `i + query_offset`).
        query_segment_ids: optional int `(batch, query_len)` document ids of the queries (0:
            padding), with `key_segment_ids` `(batch, key_len)`: a query attends only to keys of
            its own document, and the tiles where none does are skipped (module docstring).
        key_segment_ids: see `query_segment_ids`.
        key_block_size: keys per tile of a chunk when segment ids are given.
        logit_soft_cap: optional positive number: logits `tanh(scale * Q K^T / cap) * cap`
            before the biases and the mask (`keras_attn.core.softmax.soft_capped`).

    Returns:
        `(batch, query_len, heads, value_depth)` in the dtype of `value`.
    """
    check_scale(scale)  # called directly too: a scale past float32 would make every logit inf
    scale = resolved_scale(scale, query.shape[-1])
    pattern = patterns.from_shorthands(pattern, is_causal, sliding_window)
    position_bias = check_position_bias(position_bias, query.shape[2])
    query_len, key_len = query.shape[1], key.shape[1]
    chunks = pattern_query_chunks(query_len, key_len, chunk_size, pattern, query_offset)
    segment_ids = resolve_segment_ids(None, query_segment_ids, key_segment_ids, query_len, key_len)
    segment_ids = None if segment_ids[0] is None else segment_ids
    tiles = [chunk_tiles(chunk, None if segment_ids is None else key_block_size) for chunk in chunks]
    if mask is not None:
        mask = tf.convert_to_tensor(mask, tf.bool)
    # Logits in float32 whatever the compute dtype: float16 products overflow at 65,504.
    dtype = float_math_dtype(query.dtype)
    query, scale = streaming_softmax.fold_scale(tf.cast(query, dtype), scale, logit_soft_cap)
    scale = None if scale is None else tf.convert_to_tensor(scale, dtype)
    query, key = (tf.transpose(tf.cast(t, dtype), (0, 2, 1, 3)) for t in (query, key))  # (batch, heads, len, depth)
    value = tf.transpose(value, (0, 2, 1, 3))  # (batch, heads, key_len, value_depth)
    plan = _ChunkPlan(
        chunks,
        tiles,
        _dropout_seeds(tiles, dropout_rate, seed_generator),
        [[_tile_may_share(tile, segment_ids) for tile in row] for row in tiles],
        mask=mask,
        pattern=pattern,
        segment_ids=segment_ids,
        rows_may_be_empty=may_empty_rows(mask, pattern),
        key_len=key_len,
        has_bias=bias is not None,
        position_bias=position_bias,
        query_offset=query_offset,
        soft_cap=logit_soft_cap,
        dropout_rate=dropout_rate,
    )
    inputs = (query, key, value) + (() if bias is None else (tf.convert_to_tensor(bias),))
    inputs += read_bias_parameters(position_bias)
    output = streaming_softmax.custom_gradient(  # (batch, heads, query_len, value_depth)
        lambda scale, *inputs: (_forward(plan, scale, *split_inputs(inputs, plan.has_bias)), None),
        lambda scale, inputs, output, _, output_gradient: _backward(plan, scale, inputs, output, output_gradient),
        scale,
        inputs,
    )
    return tf.transpose(output, (0, 2, 1, 3))  # (batch, query_len, heads, value_depth)


@dataclasses.dataclass(frozen=True)
class _ChunkPlan:
    """The chunks of one call and, per chunk, its tiles with their dropout seeds (`None`: no
    dropout; `keep_scale` regenerates a tile's mask from its seed) and whether their queries may share a document with their keys (`None`: no segment ids,
    always computed); a tile's mask is built when the tile is computed (`tile_mask`)."""

    chunks: list
    tiles: list
    dropout_seeds: list
    may_share: list
    mask: object
    pattern: object
    segment_ids: object
    rows_may_be_empty: bool
    key_len: int
    has_bias: bool
    position_bias: object
    query_offset: int
    dropout_rate: float
    soft_cap: object = None

    @property
    def segmented(self):
        return any(flag is not None for row in self.may_share for flag in row)

    def tile_mask(self, tile):
        """The caller's mask, the pattern and the tile's document mask (from its own ids), merged."""
        merged = pattern_mask(
            None if self.mask is None else _pairwise_slice(self.mask, tile),
            self.pattern,
            tile.query_stop - tile.query_start,
            tile.key_stop - tile.key_start,
            query_offset=self.query_offset + tile.query_start,
            key_offset=tile.key_start,
        )
        if self.segment_ids is None:
            return merged
        return merge_masks(merged, segment_mask(*_tile_ids(self.segment_ids, tile)))

    def keep_scale(self, seed, weights):
        """`keep / (1 - rate)` shaped as a tile's `weights`, from the tile's dropout `seed` (the same
        in the forward and the backward pass); `None` when `seed` is (no dropout)."""
        if seed is None:
            return None
        keep = tf.random.stateless_uniform(tf.shape(weights), seed=seed) >= self.dropout_rate
        return tf.cast(keep, weights.dtype) / (1.0 - self.dropout_rate)

    def positions(self, tile):
        """The query and key positions of a tile, for its position bias."""
        return (
            block_positions(self.query_offset + tile.query_start, tile.query_stop - tile.query_start),
            block_positions(tile.key_start, tile.key_stop - tile.key_start),
        )


def _tile_ids(segment_ids, tile):
    """The document ids `(batch, tile queries)` and `(batch, tile keys)` of a tile."""
    query_ids, key_ids = segment_ids
    return query_ids[:, tile.query_start : tile.query_stop], key_ids[:, tile.key_start : tile.key_stop]


def _tile_may_share(tile, segment_ids):
    """Whether the tile's queries may share a document with its keys (`None`: no ids, always computed)."""
    if segment_ids is None or not tile.has_keys:
        return None
    return document_blocks.may_share_document(*_tile_ids(segment_ids, tile))


def _pairwise_slice(tensor, chunk):
    """A mask or bias `(batch | 1, heads | 1, query_len | 1, key_len | 1)` cut to the chunk."""
    rows = slice(None) if tensor.shape[2] == 1 else slice(chunk.query_start, chunk.query_stop)
    cols = slice(None) if tensor.shape[3] == 1 else slice(chunk.key_start, chunk.key_stop)
    return tensor[:, :, rows, cols]


def _keys(tensor, chunk):
    """Rows `[key_start, key_stop)` of a `(batch, heads, key_len, depth)` tensor."""
    return tensor[:, :, chunk.key_start : chunk.key_stop]


def _queries(tensor, chunk):
    """Rows `[query_start, query_stop)` of a `(batch, heads, query_len, depth)` tensor."""
    return tensor[:, :, chunk.query_start : chunk.query_stop]


def _dropout_seeds(tiles, dropout_rate, seed_generator):
    """Per chunk, per tile, the stateless seed `(2,)` of its dropout mask, or `None` (no dropout, no keys).

    Drawn outside the custom gradient (the seed generator's state is a variable): the forward and
    the backward pass regenerate the same masks from them (`_ChunkPlan.keep_scale`).
    """
    if dropout_rate == 0.0:
        return [[None] * len(row) for row in tiles]
    seed = keras.random.randint((2,), 0, 2**31 - 1, dtype="int32", seed=seed_generator)
    numbers = iter(range(sum(len(row) for row in tiles)))
    return [
        [tf.random.experimental.stateless_fold_in(seed, next(numbers)) if tile.has_keys else None for tile in row]
        for row in tiles
    ]


def _chunk_bias(plan, chunk, bias, parameters):
    """The additive bias `(batch | 1, heads, chunk_len | 1, chunk_keys | 1)` of a chunk: `bias` and the position bias, or `None`."""
    total = None if bias is None else tf.cast(_pairwise_slice(bias, chunk), float_math_dtype(bias.dtype))
    if plan.position_bias is not None:
        position = tf.cast(
            plan.position_bias.block_bias(parameters, *plan.positions(chunk)), plan.position_bias.bias_dtype
        )
        total = position if total is None else total + tf.cast(position, total.dtype)
    return total


def _chunk_weights(plan, chunk, mask, scale, query, key, bias, parameters):
    """Normalised float32 weights `(batch, heads, chunk_len, chunk_keys)` of a chunk over all its
    keys; a row without keys gets zero weights, so a zero output and gradient."""
    logits = streaming_softmax.raw_logits(
        _queries(query, chunk), _keys(key, chunk), plan.soft_cap
    )  # (b, h, chunk_len, chunk_keys)
    bias = _chunk_bias(plan, chunk, bias, parameters)
    bias = None if bias is None else tf.cast(bias, logits.dtype)
    if scale is not None:  # shift, then scale
        allowed = logits if mask is None else streaming_softmax.exclude(logits, mask)
        return streaming_softmax.softmax(allowed, scale, bias)[0]
    logits = logits if bias is None else logits + bias  # the scale is in the query
    if plan.rows_may_be_empty:
        return masked_softmax(logits, mask)
    return tf.nn.softmax(logits if mask is None else fill_masked(logits, mask))


def _forward(plan, scale, query, key, value, bias, parameters):
    """Output `(batch, heads, query_len, value_depth)`, one chunk after another."""
    outputs = []
    batch, heads = tf.shape(query)[0], tf.shape(query)[1]
    for index, chunk in enumerate(plan.chunks):
        if not chunk.has_keys:  # the pattern masks every key of the chunk
            shape = tf.stack([batch, heads, chunk.query_stop - chunk.query_start, value.shape[-1]])
            outputs.append(tf.zeros(shape, value.dtype))
            continue
        with _after(outputs[-1:]):  # one chunk's logits and keep-mask at a time
            if plan.segmented:
                output, _ = _documents_forward(plan, index, scale, query, key, value, bias, parameters)
                outputs.append(tf.cast(output, value.dtype))
                continue
            weights = _chunk_weights(plan, chunk, plan.tile_mask(chunk), scale, query, key, bias, parameters)
            keep_scale = plan.keep_scale(plan.dropout_seeds[index][0], weights)
            dropped = weights if keep_scale is None else weights * keep_scale
            outputs.append(tf.matmul(tf.cast(dropped, value.dtype), _keys(value, chunk)))  # (b, h, chunk_len, dv)
    return tf.concat(outputs, axis=2)  # (batch, heads, query_len, value_depth)


def _after(tensors):
    """A context in which the ops created run after `tensors` are computed.

    The chunks are independent, so TensorFlow's executor would run them all at once and hold every
    chunk's transients (logits, keep-masks, `dP`, `dZ`) together: as much as the whole matrix, more
    than Keras's attention. Ordered, one chunk's transients are freed before the next chunk's exist.
    """
    return tf.control_dependencies(tensors)


def _documents_forward(plan, index, scale, query, key, value, bias, parameters):
    """The float32 output `(batch, heads, chunk_len, value_depth)` of chunk `index` and its tiles'
    weights: each tile a softmax of its own, skipped (zero weights) where no query shares a document
    with a key, and the tiles merged into the one softmax of the chunk's rows."""
    chunk = plan.chunks[index]
    queries = _queries(query, chunk)  # (batch, heads, chunk_len, depth)
    value = tf.cast(value, queries.dtype)
    parts = []
    for tile, seed, may_share in zip(plan.tiles[index], plan.dropout_seeds[index], plan.may_share[index]):

        def computed(tile=tile, seed=seed):
            logits = streaming_softmax.raw_logits(queries, _keys(key, tile), plan.soft_cap)
            logits = streaming_softmax.exclude(logits, plan.tile_mask(tile))
            tile_bias = _chunk_bias(plan, tile, bias, parameters)
            tile_bias = None if tile_bias is None else tf.cast(tile_bias, logits.dtype)
            weights, (row_max, log_normaliser) = streaming_softmax.softmax(logits, scale, tile_bias)
            keep_scale = plan.keep_scale(seed, weights)
            dropped = weights if keep_scale is None else weights * keep_scale
            return weights, tf.matmul(dropped, _keys(value, tile)), row_max, log_normaliser

        def skipped(tile=tile):
            rows = tf.shape(queries[..., :1])  # (batch, heads, chunk_len, 1)
            no_keys = tf.fill(rows, tf.constant(-float("inf"), queries.dtype))  # M = L = -inf: weight 0 in the merge
            weights = tf.zeros(tf.concat([rows[:3], [tile.key_stop - tile.key_start]], 0), queries.dtype)
            output = tf.zeros(tf.concat([rows[:3], [value.shape[-1]]], 0), queries.dtype)
            return weights, output, no_keys, no_keys

        parts.append(document_blocks.guarded(may_share, computed, skipped))
    output, row_max, log_normaliser = streaming_softmax.merge([part[1:] for part in parts], scale)
    tile_weights = []
    for (weights, _, tile_max, tile_normaliser), may_share in zip(parts, plan.may_share[index]):
        # The tile's weights were normalised over its own keys; its share of the chunk's sum rescales them.
        share = tile_normaliser + streaming_softmax.times_scale(
            scale, tile_max - streaming_softmax.finite_or_zero(row_max)
        )
        tile_weights.append(
            document_blocks.guarded(
                may_share,
                lambda weights=weights, share=share: (
                    weights * tf.exp(share - streaming_softmax.finite_or_zero(log_normaliser))
                ),
                lambda weights=weights: weights,
            )
        )
    return output, tile_weights


def _backward(plan, scale, inputs, output, output_gradient):
    """Gradients of ([scale,] query, key, value[, bias][, bias parameters]) from each tile's
    recomputed weights (`_recomputed_weights`): the logits `z = scale * (Q K^T - M) + bias` get `dZ`, the raw logits `scale * dZ`
    (`scale=None`: folded into the query, whose gradient carries it outside). A skipped tile
    (no query sharing a document with a key) has zero weights and contributes no gradient: it is
    skipped here too."""
    query, key, value, bias, parameters = split_inputs(inputs, plan.has_bias)
    parameter_grads = tuple(tf.zeros_like(parameter) for parameter in parameters)
    dtype = float_math_dtype(query.dtype)
    query_f, key_f, value_f, output_gradient = (tf.cast(t, dtype) for t in (query, key, value, output_gradient))
    # rowsum(dO * O) = sum_k P_k dP_k, the subtracted term of the softmax gradient.
    delta = tf.reduce_sum(output_gradient * tf.cast(output, dtype), -1, keepdims=True)  # (batch, heads, q, 1)
    shifted = None
    if plan.dropout_rate == 0.0:
        # [dO, -delta] . [V, 1]^T = dP - delta: the subtraction rides on the matmul instead of
        # taking a pass over the weights (with dropout, dP is rescaled first and cannot).
        shifted = (
            tf.concat([output_gradient, -delta], -1),  # (batch, heads, q, value_depth + 1)
            tf.concat([value_f, tf.ones_like(value_f[..., :1])], -1),  # (batch, heads, k, value_depth + 1)
        )
    rows = _GradientRows(query_f, key_f, value_f, output_gradient, delta, shifted, bias, parameters)
    query_grads, bias_grads, scale_grads = [], [], []
    key_grad, value_grad = tf.zeros_like(key_f), tf.zeros_like(value_f)  # summed chunk by chunk
    for index, chunk in enumerate(plan.chunks):
        if not chunk.has_keys:
            query_grads.append(tf.zeros_like(_queries(query_f, chunk)))
            bias_grads.append(None)
            continue
        with _after([key_grad, value_grad]):  # the previous chunk's gradients are summed: its transients freed
            chunk_weights = _recomputed_weights(plan, index, scale, query, key, value, bias, parameters)
            tile_grads = [
                document_blocks.guarded(
                    may_share,
                    lambda tile=tile, weights=weights, seed=seed: _tile_gradients(
                        plan, tile, weights, seed, scale, rows
                    ),
                    lambda tile=tile, weights=weights: _skipped_gradients(tile, weights, rows),
                )
                for tile, weights, seed, may_share in zip(
                    plan.tiles[index], chunk_weights, plan.dropout_seeds[index], plan.may_share[index]
                )
            ]
        query_side = tf.add_n([grads["query"] for grads in tile_grads])  # dZ K: (batch, heads, chunk_len, depth)
        if scale is not None:
            scale_grads.append(streaming_softmax.scale_gradient(_queries(query_f, chunk), query_side))
        query_grads.append(streaming_softmax.times_scale(scale, query_side))
        key_grad += _pad_keys(_chunk_keys([grads["key"] for grads in tile_grads]), chunk, plan.key_len)
        value_grad += _pad_keys(_chunk_keys([grads["value"] for grads in tile_grads]), chunk, plan.key_len)
        if bias is not None:
            tile_bias_grads = [grads["bias"] for grads in tile_grads]
            bias_grads.append(tf.add_n(tile_bias_grads) if bias.shape[3] == 1 else _chunk_keys(tile_bias_grads, 3))
        for grads in tile_grads:
            parameter_grads = add_gradients(parameter_grads, grads["parameters"])
    grads = [] if scale is None else [tf.add_n(scale_grads) if scale_grads else tf.zeros_like(scale)]
    grads += [
        tf.cast(tf.concat(query_grads, axis=2), query.dtype),
        tf.cast(streaming_softmax.times_scale(scale, key_grad), key.dtype),
        tf.cast(value_grad, value.dtype),
    ]
    if bias is not None:
        grads.append(tf.cast(_bias_gradient(plan, bias, bias_grads), bias.dtype))
    return grads + list(parameter_grads)


def _recomputed_weights(plan, index, scale, query, key, value, bias, parameters):
    """Chunk `index`'s tiles' float32 weights, recomputed from the custom gradient's inputs by the
    forward pass's own ops (so equal to the weights its output was made of)."""
    if plan.segmented:
        return _documents_forward(plan, index, scale, query, key, value, bias, parameters)[1]
    chunk = plan.chunks[index]
    return [_chunk_weights(plan, chunk, plan.tile_mask(chunk), scale, query, key, bias, parameters)]


@dataclasses.dataclass(frozen=True)
class _GradientRows:
    """What every tile's gradient reads: the float32 inputs, `dO`, `delta`, the bias and its parameters."""

    query: object
    key: object
    value: object
    output_gradient: object
    delta: object
    shifted: object  # ([dO, -delta], [V, 1]) without dropout, else None
    bias: object
    parameters: tuple


def _tile_gradients(plan, tile, weights, seed, scale, rows):
    """A tile's `dZ K` (`query`), `dZ^T Q` (`key`, the scale still to multiply), `P^T dO` (`value`),
    its bias gradient and its position-bias parameters' gradients."""
    output_gradient = _queries(rows.output_gradient, tile)  # (batch, heads, tile queries, value_depth)
    keep_scale = plan.keep_scale(seed, weights)  # the forward pass's mask, regenerated
    if keep_scale is None:
        dropped = weights
        shifted_grad, shifted_values = rows.shifted
        logits_grad = weights * tf.matmul(_queries(shifted_grad, tile), _keys(shifted_values, tile), transpose_b=True)
    else:
        dropped = weights * keep_scale
        weights_grad = tf.matmul(output_gradient, _keys(rows.value, tile), transpose_b=True) * keep_scale  # dP
        logits_grad = streaming_softmax.logits_gradient(weights, weights_grad, _queries(rows.delta, tile))
    raw_grad = logits_grad  # dZ carried through the soft cap, recomputed from the tile's logits
    if plan.soft_cap is not None:
        capped = streaming_softmax.raw_logits(_queries(rows.query, tile), _keys(rows.key, tile), plan.soft_cap)
        raw_grad = streaming_softmax.cap_gradient(logits_grad, capped, plan.soft_cap)
    grads = {
        "query": tf.matmul(raw_grad, _keys(rows.key, tile)),  # (batch, heads, tile queries, depth)
        "key": tf.matmul(raw_grad, _queries(rows.query, tile), transpose_a=True),  # (b, h, tile keys, depth)
        "value": tf.matmul(dropped, output_gradient, transpose_a=True),  # (batch, heads, tile keys, dv)
        "parameters": bias_parameter_gradients(plan.position_bias, rows.parameters, *plan.positions(tile), logits_grad),
    }
    if rows.bias is not None:
        grads["bias"] = streaming_softmax.broadcast_bias_gradient(rows.bias, logits_grad)
    return grads


def _skipped_gradients(tile, weights, rows):
    """The zero gradients of a skipped tile, shaped as `_tile_gradients`' (`weights`: the tile's zeros)."""
    grads = {
        "query": tf.zeros_like(_queries(rows.query, tile)),
        "key": tf.zeros_like(_keys(rows.key, tile)),
        "value": tf.zeros_like(_keys(rows.value, tile)),
        "parameters": tuple(tf.zeros_like(parameter) for parameter in rows.parameters),
    }
    if rows.bias is not None:
        shape = [1 if rows.bias.shape[axis] == 1 else tf.shape(weights)[axis] for axis in range(4)]
        grads["bias"] = tf.zeros(tf.stack(shape), weights.dtype)
    return grads


def _chunk_keys(tile_grads, axis=2):
    """A chunk's tiles' key-side gradients side by side: its `[key_start, key_stop)`."""
    return tile_grads[0] if len(tile_grads) == 1 else tf.concat(tile_grads, axis)


def _pad_keys(tensor, chunk, key_len):
    """A chunk's `(batch, heads, chunk_keys, depth)` key gradient placed among all `key_len` keys."""
    return tf.pad(tensor, [[0, 0], [0, 0], [chunk.key_start, key_len - chunk.key_stop], [0, 0]])


def _bias_gradient(plan, bias, chunk_grads):
    """The gradient of a broadcast bias from each chunk's `(b | 1, h | 1, chunk_len | 1, chunk_keys | 1)` (`None`: no keys)."""
    per_chunk = []
    for chunk, grad in zip(plan.chunks, chunk_grads):
        query_rows = 1 if bias.shape[2] == 1 else chunk.query_stop - chunk.query_start
        if grad is None:
            shape = tf.stack([tf.shape(bias)[0], tf.shape(bias)[1], query_rows, tf.shape(bias)[3]])
            per_chunk.append(tf.zeros(shape, float_math_dtype(bias.dtype)))
            continue
        if bias.shape[3] != 1:
            grad = tf.pad(grad, [[0, 0], [0, 0], [0, 0], [chunk.key_start, plan.key_len - chunk.key_stop]])
        per_chunk.append(grad)
    if bias.shape[2] == 1:
        return tf.add_n(per_chunk)
    return tf.concat(per_chunk, axis=2)
