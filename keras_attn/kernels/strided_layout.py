"""The layout of one strided attention call (`keras_attn.kernels.strided`): its two parts.

- the band: query chunks of `BAND_CHUNK_SIZE`, each over one slice of `band_width` keys (and, for
  the backward pass, key chunks over slices of `band_query_width` queries);
- the strided part: positions laid out as a `(length / stride, stride)` grid whose column `r` holds
  the queries and keys of residue `r`, walked a few residues (`residues_per_step`) at a time;

with the caller's mask in each part's layout and the logits and allowed pairs of each step.
"""

import dataclasses

import keras
import tensorflow as tf

from keras_attn import patterns
from keras_attn.core.segments import segment_mask
from keras_attn.kernels import document_blocks
from keras_attn.kernels import steps
from keras_attn.kernels.cost import sampled_blocks

# Queries per chunk of the band part (a chunk of 128 under a window of 256 computes 383 keys).
BAND_CHUNK_SIZE = 128
# Logits per batch element and head of one step of the strided part (residues per step chosen so).
STRIDED_STEP_SIZE = 2**16


@dataclasses.dataclass(frozen=True)
class StridedPlan:
    """The static layout of one call: band chunks and their key slices, the residue grid."""

    pattern: object
    stride: int
    query_len: int
    key_len: int
    query_offset: int
    chunk: int  # queries per band chunk
    key_chunk: int  # keys per band chunk of the backward pass
    band_starts: tuple  # first key of each chunk's band slice
    band_width: int  # keys per band slice; 0 when the cover has no band
    band_query_starts: tuple  # first query of each key chunk's band slice (the backward pass)
    band_query_width: int  # queries per band slice of a key chunk
    soft_cap: object = None  # a logit soft cap (keras_attn.core.softmax.soft_capped), or None

    @property
    def num_chunks(self):
        return -(-self.query_len // self.chunk)

    @property
    def num_key_chunks(self):
        return -(-self.key_len // self.key_chunk)

    @property
    def front(self):
        """Empty grid cells before the first query, so that grid column `r` is residue `r`."""
        return self.query_offset % self.stride

    @property
    def query_rows(self):
        """Rows of the query grid `(query_rows, stride)`."""
        return -(-(self.front + self.query_len) // self.stride)

    @property
    def key_rows(self):
        """Rows of the key grid `(key_rows, stride)`."""
        return -(-self.key_len // self.stride)

    @property
    def residues_per_step(self):
        """Grid columns (residue classes) per loop step: the largest divisor of `stride` whose
        `(query_rows, key_rows)` logits fit `STRIDED_STEP_SIZE` (at least one)."""
        cells = max(1, self.query_rows * self.key_rows)
        return max(
            d for d in range(1, self.stride + 1) if self.stride % d == 0 and (d == 1 or d * cells <= STRIDED_STEP_SIZE)
        )

    @property
    def num_steps(self):
        return self.stride // self.residues_per_step


def plan_of(pattern, query_len, key_len, query_offset, sizes_only=False):
    """The `StridedPlan` of a call; with `sizes_only`, its sizes without the band slices (the cost
    features: the band width is then the widest of `keras_attn.kernels.cost.sampled_blocks` chunks)."""
    band, stride = pattern.strided_cover()
    chunk = max(1, min(BAND_CHUNK_SIZE, query_len))
    ranges = []
    if band is not None:
        chunks = -(-query_len // chunk)
        for start in (index * chunk for index in (sampled_blocks(chunks)[0] if sizes_only else range(chunks))):
            last = min(start + chunk, query_len) - 1
            ranges.append(band.key_range(query_offset + start, query_offset + last, key_len))
    width = max((stop - start for start, stop in ranges), default=0)
    key_chunk = max(1, min(BAND_CHUNK_SIZE, key_len))
    query_starts, query_width = (
        band_query_slices(band, key_chunk, query_len, key_len, query_offset) if width and not sizes_only else ((), 0)
    )
    if sizes_only:
        ranges = []  # a sample of the chunks: no band slices
    return StridedPlan(
        pattern=pattern,
        stride=stride,
        query_len=query_len,
        key_len=key_len,
        query_offset=query_offset,
        chunk=chunk,
        key_chunk=key_chunk,
        band_starts=tuple(min(start, key_len - width) for start, _ in ranges) if width else (),
        band_width=width,
        band_query_starts=query_starts,
        band_query_width=query_width,
    )


def band_query_slices(band, chunk, query_len, key_len, query_offset):
    """First query of each key chunk's slice of queries holding `band.query_range`, and the slices' width."""
    ranges = []
    for start in range(0, key_len, chunk):
        first, stop = band.query_range(start, start + chunk - 1, query_offset, query_offset + query_len)
        ranges.append((first - query_offset, stop - query_offset))
    width = max(1, *(stop - first for first, stop in ranges))  # one query at least, so that the slices exist
    return tuple(max(0, min(first, query_len - width)) for first, _ in ranges), width


@dataclasses.dataclass(frozen=True)
class PartMasks:
    """The caller's mask and the segment ids in each part's layout (`None`: no mask, no ids)."""

    band: object  # (batch | 1, heads | 1, num_chunks * chunk | 1, num_key_chunks * key_chunk | 1)
    grid: object  # (batch | 1, heads | 1, stride | 1, query_rows | 1, key_rows | 1)
    band_ids: object = None  # query ids (batch, num_chunks * chunk), key ids (batch, num_key_chunks * key_chunk)
    grid_ids: object = None  # query ids (batch, stride, query_rows), key ids (batch, stride, key_rows)

    @classmethod
    def of(cls, mask, plan, segment_ids=None):
        band = grid = band_ids = grid_ids = None
        if mask is not None:
            query_pad = plan.num_chunks * plan.chunk - plan.query_len if mask.shape[2] != 1 else 0
            key_pad = plan.num_key_chunks * plan.key_chunk - plan.key_len if mask.shape[3] != 1 else 0
            band = tf.pad(mask, [[0, 0], [0, 0], [0, query_pad], [0, key_pad]])
            grid = grid_mask(mask, plan)
        if segment_ids is not None:  # padded with 0: the padding belongs to no document
            query_ids, key_ids = segment_ids
            band_ids = (
                tf.pad(query_ids, [[0, 0], [0, plan.num_chunks * plan.chunk - plan.query_len]]),
                tf.pad(key_ids, [[0, 0], [0, plan.num_key_chunks * plan.key_chunk - plan.key_len]]),
            )
            grid_ids = (
                _ids_grid(query_ids, plan.front, plan.query_rows, plan.stride),
                _ids_grid(key_ids, 0, plan.key_rows, plan.stride),
            )
        return cls(band, grid, band_ids, grid_ids)


def _ids_grid(ids, front, rows, stride):
    """`(batch, length)` ids -> `(batch, stride, rows)`, laid out as `to_grid` lays out the tokens."""
    return to_grid(ids[:, None, :, None], front, rows, stride)[:, 0, :, :, 0]


def grid_mask(mask, plan):
    """`mask[b, h, query u * stride + r - front, key m * stride + r]` at `[b, h, r, u, m]`."""
    stride, (batch, heads) = plan.stride, keras.ops.shape(mask)[:2]
    query_full, key_full = mask.shape[2] != 1, mask.shape[3] != 1
    if query_full:
        back = plan.query_rows * stride - plan.front - plan.query_len
        mask = tf.pad(mask, [[0, 0], [0, 0], [plan.front, back], [0, 0]])
    if key_full:
        mask = tf.pad(mask, [[0, 0], [0, 0], [0, 0], [0, plan.key_rows * stride - plan.key_len]])
    query_shape = [plan.query_rows, stride] if query_full else [1, 1]
    key_shape = [plan.key_rows, stride] if key_full else [1, 1]
    mask = tf.reshape(mask, tf.stack([batch, heads, *query_shape, *key_shape]))  # (b, h, u, r, m, r')
    mask = tf.transpose(mask, (0, 1, 3, 2, 4, 5))  # (b, h, r, u, m, r')
    if query_full and key_full:  # a query of residue r meets the keys of residue r only
        diagonal = tf.reshape(tf.eye(stride, dtype=tf.bool), (stride, 1, 1, stride))  # (r, 1, 1, r')
        return tf.reduce_any(tf.logical_and(mask, diagonal), axis=-1)  # (b, h, r, u, m)
    if key_full:
        return tf.transpose(tf.squeeze(mask, 2), (0, 1, 4, 2, 3))  # (b, h, r', 1, m)
    return tf.squeeze(mask, -1)  # (b, h, r | 1, u | 1, 1)


def to_grid(tensor, front, rows, stride):
    """`(batch, heads, length, d)` -> `(batch, heads, stride, rows, d)`: index `t` at `[(front + t) % stride, (front + t) // stride]`."""
    batch, heads, length, depth = keras.ops.shape(tensor)
    tensor = tf.pad(tensor, [[0, 0], [0, 0], [front, rows * stride - front - length], [0, 0]])
    tensor = tf.reshape(tensor, tf.stack([batch, heads, rows, stride, depth]))
    return tf.transpose(tensor, (0, 1, 3, 2, 4))  # (batch, heads, stride, rows, d)


def from_grid(grid, front, length):
    """The inverse of `to_grid`: `(batch, heads, stride, rows, d)` -> `(batch, heads, length, d)`."""
    batch, heads, stride, rows, depth = keras.ops.shape(grid)
    tensor = tf.reshape(tf.transpose(grid, (0, 1, 3, 2, 4)), tf.stack([batch, heads, rows * stride, depth]))
    return tensor[:, :, front : front + length]


def band_block(plan, masks, index, query, key):
    """Query chunk `index`: its queries, key-slice start, logits `(b, h, chunk, width)` and allowed pairs."""
    start = band_start(plan, index)
    queries = steps.rows(query, index * plan.chunk, plan.chunk)  # (batch, heads, chunk, depth)
    logits = tf.matmul(queries, steps.rows(key, start, plan.band_width), transpose_b=True)  # (b, h, chunk, width)
    allowed = band_allowed(plan, masks, index * plan.chunk, plan.chunk, start, plan.band_width)
    return queries, start, logits, allowed


def band_allowed(plan, masks, first_query, num_queries, first_key, num_keys):
    """The band part's pairs of `num_queries` queries from `first_query` and `num_keys` keys from
    `first_key`: `(batch | 1, heads | 1, num_queries, num_keys)`."""
    rows = first_query + tf.range(num_queries)[:, None]  # (num_queries, 1) query indices
    positions = plan.query_offset + rows
    cols = first_key + tf.range(num_keys)[None, :]  # (1, num_keys) key positions
    real = tf.logical_and(rows < plan.query_len, cols < plan.key_len)  # (num_queries, num_keys)
    allowed = tf.logical_and(plan.pattern.allows(positions, cols), real)
    # The keys of the query's residue class belong to the strided part.
    allowed = tf.logical_and(allowed, tf.logical_not(patterns.Strided(plan.stride).allows(positions, cols)))
    allowed = allowed[None, None]  # (1, 1, num_queries, num_keys)
    if masks.band_ids is not None:
        allowed = tf.logical_and(allowed, segment_mask(*band_ids(masks, first_query, num_queries, first_key, num_keys)))
    if masks.band is not None:
        query_full, key_full = masks.band.shape[2] != 1, masks.band.shape[3] != 1
        block = steps.rows(masks.band, first_query, num_queries) if query_full else masks.band
        block = steps.rows(block, first_key, num_keys, axis=3) if key_full else block
        allowed = tf.logical_and(allowed, block)  # (batch | 1, heads | 1, num_queries, num_keys)
    return allowed


def grid_block(plan, masks, step, query_grid, key_grid):
    """Residues of `step`: their query and key columns, logits `(b, h, r, u, m)` and allowed pairs."""
    per_step = plan.residues_per_step
    first = step * per_step
    queries = steps.rows(query_grid, first, per_step)  # (batch, heads, per_step, query_rows, depth)
    keys = steps.rows(key_grid, first, per_step)  # (batch, heads, per_step, key_rows, depth)
    logits = tf.matmul(queries, keys, transpose_b=True)  # (batch, heads, per_step, query_rows, key_rows)
    residues = first + tf.range(per_step)[:, None, None]  # (per_step, 1, 1)
    positions = plan.query_offset - plan.front + tf.range(plan.query_rows)[:, None] * plan.stride + residues
    cols = tf.range(plan.key_rows)[None, :] * plan.stride + residues  # (per_step, 1, key_rows)
    real_query = tf.logical_and(positions >= plan.query_offset, positions < plan.query_offset + plan.query_len)
    allowed = tf.logical_and(plan.pattern.allows(positions, cols), tf.logical_and(real_query, cols < plan.key_len))
    allowed = allowed[None, None]  # (1, 1, per_step, query_rows, key_rows)
    if masks.grid_ids is not None:
        query_ids, key_ids = grid_ids(plan, masks, step)  # (batch, per_step, query_rows), (batch, per_step, key_rows)
        same = tf.logical_and(
            tf.equal(query_ids[..., None], key_ids[:, :, None]), tf.not_equal(query_ids, 0)[..., None]
        )
        allowed = tf.logical_and(allowed, same[:, None])  # (batch, 1, per_step, query_rows, key_rows)
    if masks.grid is not None:
        block = steps.rows(masks.grid, first, per_step) if masks.grid.shape[2] != 1 else masks.grid
        allowed = tf.logical_and(allowed, block)  # (batch | 1, heads | 1, per_step, query_rows, key_rows)
    return queries, keys, logits, allowed


def band_ids(masks, first_query, num_queries, first_key, num_keys):
    """The document ids `(batch, num_queries)` and `(batch, num_keys)` of a band block."""
    query_ids, key_ids = masks.band_ids
    return steps.rows(query_ids, first_query, num_queries, axis=1), steps.rows(key_ids, first_key, num_keys, axis=1)


def band_may_share(masks, first_query, num_queries, first_key, num_keys):
    """Whether a band block's queries may share a document with its keys (`None`: no ids, always)."""
    if masks.band_ids is None:
        return None
    return document_blocks.may_share_document(*band_ids(masks, first_query, num_queries, first_key, num_keys))


def band_start(plan, index):
    """The first key of query chunk `index`'s band slice (a scalar int32 tensor)."""
    return tf.gather(tf.constant(plan.band_starts, tf.int32), index)


def grid_ids(plan, masks, step):
    """The document ids of the residues of `step`: `(batch, per_step, query_rows)`, `(batch, per_step, key_rows)`."""
    return tuple(
        steps.rows(ids, step * plan.residues_per_step, plan.residues_per_step, axis=1) for ids in masks.grid_ids
    )


def grid_may_share(plan, masks, step):
    """Whether some query of `step`'s residues may share a document with a key of them (`None`: no ids)."""
    if masks.grid_ids is None:
        return None
    query_ids, key_ids = grid_ids(plan, masks, step)
    batch = tf.shape(query_ids)[0]
    return document_blocks.may_share_document(tf.reshape(query_ids, [batch, -1]), tf.reshape(key_ids, [batch, -1]))


def pad_chunks(plan, tensor):
    """`(batch, heads, query_len, d)` padded with zeros to whole band chunks."""
    return tf.pad(tensor, [[0, 0], [0, 0], [0, plan.num_chunks * plan.chunk - plan.query_len], [0, 0]])


def pad_key_chunks(plan, tensor):
    """`(batch, heads, key_len, d)` padded with zeros to whole key chunks."""
    return tf.pad(tensor, [[0, 0], [0, 0], [0, plan.num_key_chunks * plan.key_chunk - plan.key_len], [0, 0]])
