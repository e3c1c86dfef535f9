"""Which blocks of a packed row's attention hold a query and a key of the same document.

A block is a set of queries against a set of keys (a blockwise kernel's block, a chunk's key tile,
a strided band chunk or residue step). Per batch row, the smallest and largest non-zero segment id
of the block's queries and of its keys (`id_range`; `keras_attn.core.segments`) tell whether they
can share a document: only where, in some batch row, these id intervals overlap. The test is
conservative (a block holding documents 1 and 3 seems to reach a key block of document 2), exact
for packed rows, whose documents are contiguous runs of increasing ids, and never wrong, since each
computed block is masked exactly by `segment_mask` of its own ids. Padding (id 0) belongs to no
document, so a block of padding queries or keys is skipped. A row of `k` documents then costs
about the sum of their squared lengths instead of the square of the row.

Two ways to skip: the blockwise kernel reads the whole `(query_blocks, key_blocks)` table once per
call (`document_blocks`) and narrows its loops' bounds; the chunked and strided kernels, whose plans
are static, guard each tile with `tf.cond` (`may_share_document`, `guarded`). Both work eagerly, in
`tf.function` and under XLA.
"""

import dataclasses

import tensorflow as tf

from keras_attn.core.segments import segment_mask


@dataclasses.dataclass(frozen=True)
class DocumentBlocks:
    """The segment ids of one call, padded to whole blocks, and which blocks share a document.

    `query_ids` `(batch, padded_query_len)` and `key_ids` `(batch, padded_key_len)` are int32, 0 on
    the padding; `reaches[i, j]`: query block `i` may share a document with key block `j`;
    `single[i, j]`: in every batch row both blocks hold one and the same document and no padding,
    so the block needs no document mask.
    """

    query_ids: object
    key_ids: object
    reaches: object
    single: object

    def key_blocks_for(self, query_block):
        """`[start, stop)` of the key blocks that may share a document with query block `query_block`
        (`start >= stop` when none does)."""
        return _span(self.reaches[query_block])

    def query_blocks_for(self, key_block):
        """`[start, stop)` of the query blocks that may share a document with key block `key_block`."""
        return _span(self.reaches[:, key_block])

    def block_mask(self, query_block, key_block, query_block_size, key_block_size):
        """Boolean `(batch, 1, query_block_size, key_block_size)`: same non-zero document."""
        return segment_mask(
            _block(self.query_ids, query_block, query_block_size), _block(self.key_ids, key_block, key_block_size)
        )


def document_blocks(query_ids, key_ids, query_block_size, key_block_size, padded_query_len, padded_key_len):
    """`DocumentBlocks` of int `(batch, query_len)` / `(batch, key_len)` segment ids for these block sizes."""
    query_ids = _padded(query_ids, padded_query_len)
    key_ids = _padded(key_ids, padded_key_len)
    query_low, query_high, query_single = _block_ids(query_ids, query_block_size)  # each (batch, query_blocks)
    key_low, key_high, key_single = _block_ids(key_ids, key_block_size)  # each (batch, key_blocks)
    overlap = tf.logical_and(
        query_low[:, :, None] <= key_high[:, None, :], key_low[:, None, :] <= query_high[:, :, None]
    )  # (batch, query_blocks, key_blocks)
    single = tf.logical_and(
        tf.logical_and(query_single[:, :, None], key_single[:, None, :]),
        tf.equal(query_low[:, :, None], key_low[:, None, :]),
    )
    return DocumentBlocks(
        query_ids=query_ids,
        key_ids=key_ids,
        reaches=tf.reduce_any(overlap, axis=0),
        single=tf.reduce_all(single, axis=0),
    )


def _padded(ids, padded_len):
    ids = tf.cast(ids, tf.int32)
    return tf.pad(ids, [[0, 0], [0, padded_len - tf.shape(ids)[1]]])  # padding is document 0


def _block_ids(ids, block_size):
    """Per batch row and block: `id_range` of the block and whether the block is one document without padding."""
    blocks = tf.reshape(ids, tf.stack([tf.shape(ids)[0], -1, block_size]))  # (batch, blocks, block_size)
    low, high = id_range(blocks, axis=-1)
    single = tf.logical_and(tf.reduce_all(tf.not_equal(blocks, 0), axis=-1), tf.equal(low, high))
    return low, high, single


def _span(reaches):
    """`[first, last + 1)` of the `True` entries of a boolean vector; `(n, 0)` when there is none."""
    count = tf.shape(reaches)[0]
    index = tf.range(count)
    return (
        tf.reduce_min(tf.where(reaches, index, count)),
        tf.reduce_max(tf.where(reaches, index + 1, 0)),
    )


def _block(ids, block, block_size):
    return tf.slice(ids, tf.stack([0, block * block_size]), tf.stack([-1, block_size]))


def id_range(ids, axis=1):
    """The smallest and largest non-zero id along `axis` of int32 `ids` `(batch, ...)`: a block's
    documents; an all-padding block gets the empty range `(int32 max, int32 min)`."""
    real = tf.not_equal(ids, 0)
    low = tf.reduce_min(tf.where(real, ids, tf.int32.max), axis)
    high = tf.reduce_max(tf.where(real, ids, tf.int32.min), axis)
    return low, high


def may_share_document(query_ids, key_ids):
    """Scalar bool: whether some query of `query_ids` `(batch, queries)` may attend to a key of
    `key_ids` `(batch, keys)`, in any row of the batch (overlapping id ranges)."""
    (query_low, query_high), (key_low, key_high) = id_range(query_ids), id_range(key_ids)
    overlap = tf.logical_and(query_low <= key_high, key_low <= query_high)  # (batch,)
    return tf.reduce_any(overlap)


def guarded(may_share, compute, skipped):
    """`compute()` when the block may share a document (`may_share`, a scalar bool tensor), else
    `skipped()` (what the block contributes when left out); `may_share=None` means always computed."""
    if may_share is None:
        return compute()
    # The branches are plain TensorFlow: AutoGraph converting them again at each trace only costs time.
    return tf.cond(
        may_share,
        tf.autograph.experimental.do_not_convert(compute),
        tf.autograph.experimental.do_not_convert(skipped),
    )
