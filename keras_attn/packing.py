"""Packing variable-length documents into rows of a fixed length, in `tf.data`, and back.

`pack` turns a dataset of documents (a 1-D token tensor each, or a dict of token features with
per-document features such as a label) into a dataset of rows of a fixed length holding several
documents each, with the segment ids (`1..k` per row, `0` for padding) that the attention layers
take and the positions that restart per document (`keras_attn.document_positions`). Every op is a
TensorFlow graph op: the packer runs inside `tf.data` (no `py_function`) and under `tf.function`.
As T5's and seqio's packers do, it reads `window` consecutive documents at a time and places each,
in order, into the first row it fits in (`"first_fit"`) or into the fullest row it fits in
(`"best_fit"`), opening a new row when none fits.

`unpack` is the inverse for a model's outputs: per-token outputs `(batch, length, ...)` become a
`RaggedTensor` with one row per document, per-document outputs `(batch, max_documents, ...)`
(`MaskedGlobalPooling(max_documents=...)`, `AttentionPooling(max_documents=...)`) a dense tensor
with one row per document. `mean_over_documents` and `mean_over_tokens` average per-document or
per-token losses over the real documents or tokens only, so a packed batch has the loss the same
documents have unpacked.
"""

import reprlib

import tensorflow as tf

from keras_attn.core.segments import document_positions
from keras_attn.utils import check_leading_sizes
from keras_attn.validation import check_bool
from keras_attn.validation import check_choice
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_segment_ids
from keras_attn.validation import check_tensor

__all__ = ["pack", "unpack", "place", "mean_over_documents", "mean_over_tokens"]

STRATEGIES = ("first_fit", "best_fit")
DOCUMENT_MASK = "document_mask"
TOKENS = "tokens"  # the name of the token feature of a dataset of plain tensors


def pack(dataset, row_length, *, max_documents=None, strategy="first_fit", window=128, truncate=False):
    """Packs a dataset of variable-length documents into rows of `row_length` tokens.

    Each document goes whole into one row (never split across rows); documents keep their order
    within a row. Every document of the input is in exactly one output row.

    Fitting on the rows: how many rows the documents make depends on their lengths, so the rows'
    dataset has no known length (`cardinality()` is unknown), and Keras's `fit` warns "Your input
    ran out of data" at the end of each epoch of such a dataset. Repeat the batches and give the
    epoch's length: `model.fit(rows.batch(b).repeat(), steps_per_epoch=steps, epochs=...)`, where
    `steps` may be counted once (`rows.batch(b).reduce(0, lambda count, _: count + 1)`) or chosen.

    Args:
        dataset: a `tf.data.Dataset` whose elements are either a 1-D tensor (one document's
            tokens), or a dict of features: 1-D token features (variable length; each gets its own
            segment ids and positions, e.g. a translator's `"inputs"` and `"targets"`) and
            per-document features of a fixed shape (e.g. a scalar `"label"`).
        row_length: an int (the length of the rows of every token feature), or a dict
            `{token feature: its row length}`, which also names the token features (every other
            feature is then a per-document feature). With an int, the rank-1 features of a dict
            are its token features.
        max_documents: the most documents a row holds (the size of its per-document features);
            defaults to the smallest row length (a row of one-token documents).
        strategy: `"first_fit"` (the first row a document fits in) or `"best_fit"` (the row it
            leaves the least room in), among the rows of the current window.
        window: how many consecutive documents are packed together: larger windows pack tighter
            and take longer per window (the search is linear in the rows open).
        truncate: `False` (default): a document longer than its row length raises an
            `InvalidArgumentError` when the dataset reaches it; `True` keeps its first
            `row_length` tokens.

    Returns:
        A dataset of rows, each a dict: for a dataset of tensors, `"tokens"` `(row_length,)`,
        `"segment_ids"` (int32, document `1, 2, ...` of the row, `0` for padding) and
        `"positions"` (int32, restarting at 0 in each document); for a dataset of dicts,
        `"<feature>"`, `"<feature>_segment_ids"` and `"<feature>_positions"` for each token
        feature. Per-document features become `(max_documents, ...)` (document `s` of the row at
        index `s - 1`, zeros after the last), and `"document_mask"` `(max_documents,)` is `True`
        for the row's documents. Batch the rows with `.batch(...)`.

    Example:

    >>> documents = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[5, 6, 7], [8, 9], [3, 4, 5, 6]]))
    >>> rows = pack(documents, row_length=5, max_documents=2)
    >>> for row in rows.as_numpy_iterator():
    ...     print(row["tokens"], row["segment_ids"], row["positions"], row["document_mask"])
    [5 6 7 8 9] [1 1 1 2 2] [0 1 2 0 1] [ True  True]
    [3 4 5 6 0] [1 1 1 1 0] [0 1 2 3 0] [ True False]
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            "`dataset` must be a `tf.data.Dataset` of documents; make one from a list of token lists with "
            "`tf.data.Dataset.from_tensor_slices(tf.ragged.constant(documents))`. "
            f"Received: dataset={reprlib.repr(dataset)} (a {type(dataset).__name__})"
        )
    check_choice("strategy", strategy, STRATEGIES)
    check_positive_int("window", window)
    check_bool("truncate", truncate)
    plain = isinstance(dataset.element_spec, (tf.TensorSpec, tf.RaggedTensorSpec))
    if not plain and not isinstance(dataset.element_spec, dict):
        raise ValueError(
            "`dataset` elements must be one document's tokens (a 1-D tensor) or a dict of features; put the "
            "parts of a tuple under names (`dataset.map(lambda tokens, label: {'tokens': tokens, 'label': label})`). "
            f"Received: dataset.element_spec={dataset.element_spec}"
        )
    if plain:
        dataset = dataset.map(lambda tokens: {TOKENS: tokens})
    limits = _row_lengths(row_length, dataset.element_spec)
    if max_documents is None:
        max_documents = min(limits.values())
    check_positive_int("max_documents", max_documents)
    documents = _documents(dataset.element_spec, limits)
    if DOCUMENT_MASK in documents:
        raise ValueError(
            f"A per-document feature may not be named {DOCUMENT_MASK!r}: the packed rows use that name for the "
            f"mask of their documents. Received features: {sorted(dataset.element_spec)}"
        )
    packer = _Packer(limits, documents, max_documents, strategy, truncate)
    dataset = dataset.ragged_batch(window)
    rows = dataset.map(packer.pack_window, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if plain:
        rows = rows.map(_plain_names)
    return rows


def unpack(values, document_mask, segment_ids=None):
    """A packed batch's outputs, one per document, in the order of the rows and of the documents in each.

    Args:
        values: per-document outputs `(batch, max_documents, ...)` (a pooling layer's, with
            `segment_ids=None`), or per-token outputs `(batch, length, ...)` (with `segment_ids`).
        document_mask: boolean `(batch, max_documents)`, `True` for the rows' documents (the
            packed rows' `"document_mask"`).
        segment_ids: int `(batch, length)` for per-token `values`: document `s` of a row is its
            tokens with id `s`, in row order (`keras_attn.core.segments.DOCUMENTS`; `pack` lays
            them out `1, 2, ...`, each contiguous), `s` at most `max_documents`.

    Returns:
        Per-document `values`: a tensor `(documents, ...)`. Per-token `values`: a
        `tf.RaggedTensor` `(documents, None, ...)`, each document's tokens in order.

    Example:

    >>> segment_ids = tf.constant([[1, 1, 2, 0], [1, 1, 1, 0]])
    >>> document_mask = tf.constant([[True, True], [True, False]])
    >>> unpack(tf.constant([[10, 11, 20, 0], [30, 31, 32, 0]]), document_mask, segment_ids).to_list()
    [[10, 11], [20], [30, 31, 32]]
    >>> unpack(tf.constant([[1.0, 2.0], [3.0, 0.0]]), document_mask).numpy().tolist()
    [1.0, 2.0, 3.0]
    """
    values = tf.convert_to_tensor(values)
    if values.shape.rank < 2:
        raise ValueError(
            "`values` must be per-document `(batch, max_documents, ...)` or per-token `(batch, length, ...)` "
            f"outputs. Received: values.shape={tuple(values.shape)}"
        )
    document_mask = _checked_document_mask(document_mask)
    if segment_ids is None:
        check_leading_sizes("values", 2, values=values, document_mask=document_mask)
        return tf.boolean_mask(values, document_mask)
    check_leading_sizes("values", 1, values=values, document_mask=document_mask)
    segment_ids = check_segment_ids("segment_ids", segment_ids, values.shape[0], values.shape[1], of="`values`")
    max_documents = tf.shape(document_mask)[1]
    _check_ids_within(segment_ids, document_mask.shape[1])
    # Each document's tokens in row order, the documents in id order: a stable sort of each row by id
    # honours any layout of the ids (`keras_attn.core.segments.DOCUMENTS`).
    order = tf.argsort(segment_ids, axis=1, stable=True)  # (batch, length)
    sorted_ids = tf.gather(segment_ids, order, batch_dims=1)
    sorted_values = tf.gather(values, order, batch_dims=1)
    slots = tf.range(1, max_documents + 1, dtype=tf.int32)  # (max_documents,)
    lengths = tf.reduce_sum(tf.cast(tf.equal(segment_ids[:, :, None], slots), tf.int32), axis=1)  # (batch, docs)
    in_slot = tf.logical_and(sorted_ids > 0, sorted_ids <= max_documents)
    documents = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(sorted_values, in_slot), tf.reshape(lengths, [-1]))
    return tf.ragged.boolean_mask(documents, tf.reshape(document_mask, [-1]))


def _checked_document_mask(document_mask):
    """`document_mask` as bool `(batch, max_documents)`: booleans, or integers 0 and 1."""
    document_mask = check_tensor("document_mask", document_mask, dtype=("bool", "int"), rank=2)
    if document_mask.dtype != tf.bool:
        check_tensor("document_mask", document_mask, dtype="int", rank=2, at_least=0)
        document_mask = tf.not_equal(document_mask, 0)
    return document_mask


def _check_ids_within(segment_ids, max_documents):
    """A `ValueError` when eager ids number a document past `max_documents` (its tokens have no slot)."""
    if max_documents is not None and not tf.is_symbolic_tensor(segment_ids):
        past = segment_ids.numpy()[segment_ids.numpy() > max_documents]
        if past.size:
            raise ValueError(
                f"`segment_ids` must number documents 1..max_documents={max_documents} (the width of "
                f"`document_mask`). Received: segment_ids holding {sorted(set(past.tolist()))[:5]}"
            )


def place(lengths, row_length, *, strategy="first_fit"):
    """Where each document goes in rows of `row_length` tokens: its row and its offset in that row.

    The placement `pack` makes within each window, for a pipeline that lays its batches out itself
    (e.g. keeping one step's examples together: sort the lengths, longest first, for first-fit
    decreasing). Graph ops only. The documents are placed one by one in the order given, each into
    the first open row it fits (`"first_fit"`) or the fullest (`"best_fit"`), a new row opened when
    none fits; the rows used are `0, 1, ...`.

    Args:
        lengths: int `(documents,)`, each in `[0, row_length]`.
        row_length: an int, the tokens of a row.
        strategy: `"first_fit"` or `"best_fit"`.

    Returns:
        `(rows, offsets)`: int32 `(documents,)` each.

    Example:

    >>> rows, offsets = place([3, 2, 4], row_length=5)
    >>> rows.numpy().tolist(), offsets.numpy().tolist()
    ([0, 0, 1], [0, 3, 0])
    """
    check_choice("strategy", strategy, STRATEGIES)
    check_positive_int("row_length", row_length)
    lengths = tf.cast(check_tensor("lengths", lengths, dtype="int", rank=1, at_least=0, at_most=row_length), tf.int32)
    too_long = tf.debugging.assert_less_equal(
        lengths, row_length, message=f"A document is longer than its row: `row_length`={row_length}. The lengths"
    )
    with tf.control_dependencies([too_long]):
        lengths = tf.identity(lengths)[:, None]  # (documents, 1): one token feature
    rows = _rows(lengths, tf.constant([row_length], tf.int32), strategy, tf.int32.max)
    return rows, _slots_and_offsets(rows, lengths)[1][:, 0]


def mean_over_documents(losses, document_mask):
    """The mean of per-document `losses` `(batch, max_documents)` over the real documents only.

    Equals the mean loss of the same documents unpacked (one per row). In `model.fit` the same
    is `sample_weight=document_mask` with a loss built with `reduction="mean_with_sample_weight"`.

    >>> float(mean_over_documents(tf.constant([[1.0, 3.0], [5.0, 99.0]]), tf.constant([[1, 1], [1, 0]])))
    3.0
    """
    losses = check_tensor("losses", losses, dtype="float", rank=2)
    return _masked_mean(losses, _checked_document_mask(document_mask), "document_mask")


def mean_over_tokens(losses, segment_ids):
    """The mean of per-token `losses` `(batch, length)` over the real tokens (segment id not 0).

    Equals the mean over the real tokens of the same documents padded one per row (a language
    model's loss): padding contributes nothing to the sum or to the count.

    >>> float(mean_over_tokens(tf.constant([[1.0, 2.0, 3.0, 99.0]]), tf.constant([[1, 1, 2, 0]])))
    2.0
    """
    losses = check_tensor("losses", losses, dtype="float", rank=2)
    segment_ids = check_segment_ids("segment_ids", segment_ids, *losses.shape, of="`losses`")
    return _masked_mean(losses, tf.not_equal(segment_ids, 0), "segment_ids")


def _masked_mean(values, mask, mask_name):
    """The mean of `values` where `mask` holds; a value outside it (NaN, inf) is selected away, not multiplied."""
    check_leading_sizes("losses", 2, losses=values, **{mask_name: mask})
    kept = tf.where(mask, values, tf.zeros_like(values))
    return tf.reduce_sum(kept) / tf.maximum(tf.reduce_sum(tf.cast(mask, values.dtype)), 1.0)


class _Packer:
    """Packs one window of documents (a padded batch) into rows, with graph ops only."""

    def __init__(self, limits, documents, max_documents, strategy, truncate):
        self.names = sorted(limits)
        self.limits = tf.constant([limits[name] for name in self.names], tf.int32)  # (features,)
        self.row_lengths = limits
        self.documents = documents
        self.max_documents = max_documents
        self.strategy = strategy
        self.truncate = truncate

    def pack_window(self, batch):
        tokens = {name: self.fitted(name, batch[name]) for name in self.names}  # each (n, None)
        lengths = tf.stack([tf.cast(tokens[name].row_lengths(), tf.int32) for name in self.names], axis=1)
        row, slot, offset, num_rows = self.place(lengths)  # lengths: (n, features)
        packed = {}
        for index, name in enumerate(self.names):
            packed.update(self.token_feature(name, tokens[name], row, slot, offset[:, index], num_rows))
        where = tf.stack([row, slot], axis=1)  # (n, 2)
        shape = tf.stack([num_rows, self.max_documents])
        for name in self.documents:
            values = batch[name]
            packed[name] = tf.scatter_nd(where, values, tf.concat([shape, tf.shape(values)[1:]], axis=0))
        packed[DOCUMENT_MASK] = tf.scatter_nd(where, tf.ones_like(row, tf.bool), shape)
        return packed

    def fitted(self, name, tokens):
        """A window's documents of one token feature as a `RaggedTensor`, checked against (or cut to) its row length."""
        if not isinstance(tokens, tf.RaggedTensor):
            tokens = tf.RaggedTensor.from_tensor(tokens)  # documents of a fixed length come batched dense
        limit = self.row_lengths[name]
        if self.truncate:
            return tokens[:, :limit]
        too_long = tf.debugging.assert_less_equal(
            tf.cast(tokens.row_lengths(), tf.int32),
            limit,
            message=(
                f"A document's {name!r} is longer than its row: `row_length`={limit}. Pass a larger "
                "`row_length`, or `truncate=True` to keep its first `row_length` tokens. The lengths"
            ),
        )
        with tf.control_dependencies([too_long]):
            return tf.identity(tokens)

    def place(self, lengths):
        """Each document's row, slot (its index within the row) and offsets, and the rows used."""
        rows = _rows(lengths, self.limits, self.strategy, self.max_documents)  # (n,)
        slot, offset = _slots_and_offsets(rows, lengths)
        return rows, slot, offset, tf.reduce_max(rows) + 1

    def token_feature(self, name, tokens, row, slot, offset, num_rows):
        """The rows of one token feature, its segment ids and positions, from each document's place."""
        document = tokens.value_rowids()  # (tokens,): which document each token is of
        within = tf.range(tf.shape(document, out_type=tf.int64)[0]) - tf.gather(tokens.row_starts(), document)
        where = tf.stack([tf.gather(row, document), tf.gather(offset, document) + tf.cast(within, tf.int32)], axis=1)
        shape = tf.stack([num_rows, self.row_lengths[name]])
        segment_ids = tf.scatter_nd(where, tf.gather(slot, document) + 1, shape)
        return {
            name: tf.scatter_nd(where, tokens.flat_values, shape),
            f"{name}_segment_ids": segment_ids,
            f"{name}_positions": document_positions(segment_ids),
        }


def _rows(lengths, limits, strategy, max_documents):
    """Each document's row, placing the documents `(n, features)` one by one in order into rows of
    `limits` `(features,)` tokens holding at most `max_documents` documents.

    There are as many candidate rows as documents, the unopened ones empty: a document always
    fits the first of them (its length was checked), so a document that fits no open row opens
    the next one, and `"best_fit"` prefers any open row it fits (it leaves no more room).
    """
    n = tf.shape(lengths)[0]

    def place_one(i, fill, count, rows):
        length = lengths[i]  # (features,)
        room = limits - fill - length  # (n, features): what each row would have left
        fits = tf.reduce_all(room >= 0, axis=1) & (count < max_documents)
        if strategy == "first_fit":
            chosen = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        else:
            chosen = tf.argmin(tf.where(fits, tf.reduce_sum(room, axis=1), tf.int32.max), output_type=tf.int32)
        at = [[chosen]]
        return (
            i + 1,
            tf.tensor_scatter_nd_add(fill, at, length[None]),
            tf.tensor_scatter_nd_add(count, at, [1]),
            rows.write(i, chosen),
        )

    state = (tf.constant(0), tf.zeros_like(lengths), tf.zeros([n], tf.int32), tf.TensorArray(tf.int32, size=n))
    return tf.while_loop(lambda i, *_: i < n, place_one, state)[3].stack()


def _slots_and_offsets(rows, lengths):
    """Each document's index within its row and its offsets `(n, features)` there (the lengths of the
    documents placed before it in the same row)."""
    index = tf.range(tf.shape(rows)[0])
    earlier = tf.equal(rows[:, None], rows[None, :]) & (index[None, :] < index[:, None])  # (n, n): same row, before
    slot = tf.reduce_sum(tf.cast(earlier, tf.int32), axis=1)
    offset = tf.reduce_sum(tf.cast(earlier, tf.int32)[:, :, None] * lengths[None], axis=1)  # (n, features)
    return slot, offset


def _row_lengths(row_length, spec):
    """`{token feature: its row length}`, after checking them against the dataset's features."""
    if isinstance(row_length, dict):
        missing = sorted(set(row_length) - set(spec))
        if missing:
            raise ValueError(
                f"`row_length` names features the dataset does not have: {missing}. "
                f"Received: row_length={row_length}, features={sorted(spec)}"
            )
        limits = dict(row_length)
    else:
        limits = {name: row_length for name, feature in spec.items() if feature.shape.rank == 1}
        if not limits:
            raise ValueError(
                "The dataset has no 1-D (token) feature to pack. Received: element_spec="
                f"{ {name: feature.shape for name, feature in spec.items()} }"
            )
    for name, limit in limits.items():
        check_positive_int(f"row_length[{name!r}]" if isinstance(row_length, dict) else "row_length", limit)
        if spec[name].shape.rank != 1:
            raise ValueError(
                f"Token feature {name!r} must be 1-D (one document's tokens). Received: shape={spec[name].shape}"
            )
    return limits


def _documents(spec, limits):
    """The per-document features: every feature that is not a token feature, of a fixed shape."""
    documents = sorted(set(spec) - set(limits))
    for name in documents:
        if not spec[name].shape.is_fully_defined():
            raise ValueError(
                f"Per-document feature {name!r} must have a fixed shape (it is laid out `(max_documents, ...)`); "
                f"name it in `row_length` if it is a token feature. Received: shape={spec[name].shape}"
            )
    return documents


def _plain_names(row):
    return {
        "tokens": row[TOKENS],
        "segment_ids": row[f"{TOKENS}_segment_ids"],
        "positions": row[f"{TOKENS}_positions"],
        DOCUMENT_MASK: row[DOCUMENT_MASK],
    }
