"""Attention patterns: which keys each query may attend to, by position.

A pattern is the structural part of an attention mask (causal, local, strided, block-local,
global tokens and their combinations). It answers these questions about query positions x key
positions, and every kernel asks it only these:

- `allows(rows, cols)`: elementwise, whether query position `rows` may see key position `cols`
  (broadcasting), and from it `mask(rows, cols)`: the boolean `(len(rows), len(cols))` mask;
- `key_range(first_row, last_row, key_len)` / `query_range(...)`: a conservative `[start, stop)`
  of the keys a block of queries can reach (the queries that can reach a block of keys), so the
  chunked and blockwise kernels never compute the blocks a pattern excludes;
- `block_full(...)`: whether a block is certainly all allowed, so its mask need not be built;
- `strided_cover()`: a band pattern plus a stride whose residue classes hold the rest, so the
  strided kernel computes a band and one residue class per query instead of every block a
  strided component reaches.

Positions are absolute: query `i` of a call sits at position `query_offset + i` among the keys
(cached decoding), key `j` at position `j`. The range methods take Python ints (static plans,
which return ints) or scalar int tensors (loops inside `tf.while_loop`).

`document_mask` intersects a pattern with the documents of packed rows (segment ids).

Patterns combine with `&` (intersection) and `|` (union) and serialise with
`keras.saving.serialize_keras_object`:

>>> pattern = Causal() & (SlidingWindow(128) | Strided(128))  # Sparse Transformer, causal
"""

import math

import keras
from keras import ops

from keras_attn.validation import check_position
from keras_attn.validation import check_positive_int
from keras_attn.validation import check_segment_ids

_PACKAGE = "keras_attn"


class Pattern:
    """Base class of the attention patterns; subclasses implement `allows` and, where they can
    bound them, the ranges, `block_full` and `strided_cover`."""

    def allows(self, rows, cols):
        """Boolean, elementwise: `True` where query position `rows` may see key position `cols`
        (int32 tensors that broadcast together, e.g. `(n, 1)` and `(1, m)`)."""
        raise NotImplementedError

    def mask(self, rows, cols):
        """Boolean `(len(rows), len(cols))`: `True` where query position `rows[i]` may see key `cols[j]`."""
        return self.allows(*_pairs(rows, cols))  # (query_len, key_len)

    def strided_cover(self):
        """`(band, stride)`: every pair this pattern allows is allowed by the pattern `band`, whose
        `key_range` bounds the keys it reaches, or has `(i - j) % stride == 0` (`Strided(stride)`).

        `band=None`: no band part; `stride=None`: no strided part. A pattern is its own band; the
        strided kernel (`keras_attn.kernels.strided`) computes `band.key_range` and the keys of
        each query's residue class instead of every key a strided pattern's `key_range` spans.
        """
        return self, None

    def key_range(self, first_row, last_row, key_len):
        """`[start, stop)` within `[0, key_len)` holding every key queries `first_row..last_row` may see."""
        return 0, key_len

    def query_range(self, first_col, last_col, query_start, query_stop):
        """`[start, stop)` within `[query_start, query_stop)` holding every query that may see keys `first_col..last_col`."""
        return query_start, query_stop

    def block_full(self, first_row, last_row, first_col, last_col):
        """Whether every query `first_row..last_row` certainly sees every key `first_col..last_col`."""
        return False

    @property
    def may_empty_rows(self):
        """Whether some query may see no key at all (its output must then be zeroed)."""
        return True

    def block_mask(self, query_len, key_len, query_offset=0, key_offset=0):
        """Boolean `(1, 1, query_len, key_len)` mask of queries at `query_offset + i`, keys at `key_offset + j`."""
        for name, value in (
            ("query_len", query_len),
            ("key_len", key_len),
            ("query_offset", query_offset),
            ("key_offset", key_offset),
        ):
            check_position(name, value)
        rows = ops.arange(query_len, dtype="int32") + ops.cast(query_offset, "int32")
        cols = ops.arange(key_len, dtype="int32") + ops.cast(key_offset, "int32")
        return ops.reshape(self.mask(rows, cols), (1, 1, query_len, key_len))

    def __and__(self, other):
        return Intersection(self, _check_pattern("other", other))

    def __or__(self, other):
        return Union(self, _check_pattern("other", other))

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def _pairs(rows, cols):
    """`(len(rows), 1)` query positions and `(1, len(cols))` key positions."""
    return ops.expand_dims(ops.cast(rows, "int32"), -1), ops.expand_dims(ops.cast(cols, "int32"), 0)


def _is_static(*values):
    return all(isinstance(value, (int, bool)) for value in values)


def _minimum(a, b):
    return min(a, b) if _is_static(a, b) else ops.minimum(a, b)


def _maximum(a, b):
    return max(a, b) if _is_static(a, b) else ops.maximum(a, b)


def _logical_and(a, b):
    return (a and b) if _is_static(a, b) else ops.logical_and(a, b)


def _logical_or(a, b):
    return (a or b) if _is_static(a, b) else ops.logical_or(a, b)


def _where(condition, a, b):
    return (a if condition else b) if _is_static(condition) else ops.where(condition, a, b)


def _clip(start, stop, low, high):
    """`[start, stop)` clipped to `[low, high)`, never with `stop < start`."""
    start = _minimum(_maximum(start, low), high)
    return start, _maximum(_minimum(stop, high), start)


def _intersect(left, right):
    """The `[start, stop)` common to two ranges (empty at `start` when they do not meet)."""
    start = _maximum(left[0], right[0])
    return start, _maximum(_minimum(left[1], right[1]), start)


def _unite(left, right):
    """The smallest `[start, stop)` holding two ranges."""
    return _minimum(left[0], right[0]), _maximum(left[1], right[1])


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Causal(Pattern):
    """Query at position `i` sees keys `j <= i` (autoregressive)."""

    def allows(self, rows, cols):
        return ops.less_equal(cols, rows)

    def key_range(self, first_row, last_row, key_len):
        return _clip(0, last_row + 1, 0, key_len)

    def query_range(self, first_col, last_col, query_start, query_stop):
        return _clip(first_col, query_stop, query_start, query_stop)

    def block_full(self, first_row, last_row, first_col, last_col):
        return last_col <= first_row

    @property
    def may_empty_rows(self):
        return False  # query i >= 0 always sees key 0


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SlidingWindow(Pattern):
    """Query at position `i` sees keys with `|i - j| < window` (local attention, Keras's `sliding_window`).

    With `Causal() & SlidingWindow(w)` a query sees itself and the `w - 1` keys before it.
    """

    def __init__(self, window):
        check_positive_int("window", window)
        self.window = window

    def allows(self, rows, cols):
        return ops.less(ops.abs(rows - cols), self.window)

    def key_range(self, first_row, last_row, key_len):
        return _clip(first_row - self.window + 1, last_row + self.window, 0, key_len)

    def query_range(self, first_col, last_col, query_start, query_stop):
        return _clip(first_col - self.window + 1, last_col + self.window, query_start, query_stop)

    def block_full(self, first_row, last_row, first_col, last_col):
        return _maximum(last_row - first_col, last_col - first_row) < self.window

    def get_config(self):
        return {"window": self.window}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Strided(Pattern):
    """Query at position `i` sees keys with `(i - j) % stride == 0` (Child et al., Sparse Transformer).

    Combine it with a local window for the paper's "strided" pattern and with `Causal()` for the
    autoregressive one: `Causal() & (SlidingWindow(s) | Strided(s))`.
    """

    def __init__(self, stride):
        check_positive_int("stride", stride)
        self.stride = stride

    def allows(self, rows, cols):
        return ops.equal(ops.mod(rows - cols, self.stride), 0)

    def block_full(self, first_row, last_row, first_col, last_col):
        return self.stride == 1

    def strided_cover(self):
        return None, self.stride

    @property
    def may_empty_rows(self):
        return True  # key i % stride may lie beyond the keys

    def get_config(self):
        return {"stride": self.stride}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class BlockLocal(Pattern):
    """Query at position `i` sees the keys of its own block, `i // block_size == j // block_size` (Qiu et al.)."""

    def __init__(self, block_size):
        check_positive_int("block_size", block_size)
        self.block_size = block_size

    def allows(self, rows, cols):
        return ops.equal(rows // self.block_size, cols // self.block_size)

    def key_range(self, first_row, last_row, key_len):
        size = self.block_size
        return _clip(first_row // size * size, (last_row // size + 1) * size, 0, key_len)

    def query_range(self, first_col, last_col, query_start, query_stop):
        size = self.block_size
        return _clip(first_col // size * size, (last_col // size + 1) * size, query_start, query_stop)

    def block_full(self, first_row, last_row, first_col, last_col):
        size = self.block_size
        same = _logical_and(first_row // size == last_row // size, first_col // size == last_col // size)
        return _logical_and(same, first_row // size == first_col // size)

    def get_config(self):
        return {"block_size": self.block_size}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class GlobalTokens(Pattern):
    """The first `num_tokens` positions see every key and are seen by every query (Longformer, BigBird).

    Alone it allows only the pairs touching a global token; use it in a union,
    e.g. `SlidingWindow(128) | GlobalTokens(1)`.
    """

    def __init__(self, num_tokens):
        check_positive_int("num_tokens", num_tokens)
        self.num_tokens = num_tokens

    def allows(self, rows, cols):
        return ops.logical_or(ops.less(rows, self.num_tokens), ops.less(cols, self.num_tokens))

    def key_range(self, first_row, last_row, key_len):
        # Global queries see every key; the others only the global keys.
        return _clip(0, _where(first_row < self.num_tokens, key_len, self.num_tokens), 0, key_len)

    def query_range(self, first_col, last_col, query_start, query_stop):
        stop = _where(first_col < self.num_tokens, query_stop, self.num_tokens)
        return _clip(query_start, stop, query_start, query_stop)

    def block_full(self, first_row, last_row, first_col, last_col):
        return _logical_or(last_row < self.num_tokens, last_col < self.num_tokens)

    @property
    def may_empty_rows(self):
        return False  # every query sees key 0

    def get_config(self):
        return {"num_tokens": self.num_tokens}


class _Combination(Pattern):
    """Two patterns combined pairwise: masks by `_masks`, ranges by `_ranges`, full blocks by `_full`."""

    def __init__(self, left, right):
        self.left = _check_pattern("left", left)
        self.right = _check_pattern("right", right)

    def allows(self, rows, cols):
        return self._masks(self.left.allows(rows, cols), self.right.allows(rows, cols))

    def key_range(self, first_row, last_row, key_len):
        return self._ranges(*(side.key_range(first_row, last_row, key_len) for side in (self.left, self.right)))

    def query_range(self, first_col, last_col, query_start, query_stop):
        return self._ranges(
            *(side.query_range(first_col, last_col, query_start, query_stop) for side in (self.left, self.right))
        )

    def block_full(self, first_row, last_row, first_col, last_col):
        return self._full(
            *(side.block_full(first_row, last_row, first_col, last_col) for side in (self.left, self.right))
        )

    def strided_cover(self):
        (left_band, left_stride), (right_band, right_stride) = self.left.strided_cover(), self.right.strided_cover()
        strides = [stride for stride in (left_stride, right_stride) if stride is not None]
        # Two residue classes lie in the classes of their strides' gcd.
        return self._bands(left_band, right_band), (math.gcd(*strides) if strides else None)

    def get_config(self):
        return {
            "left": keras.saving.serialize_keras_object(self.left),
            "right": keras.saving.serialize_keras_object(self.right),
        }

    @classmethod
    def from_config(cls, config):
        return cls(get(config["left"]), get(config["right"]))

    def __repr__(self):
        return f"({self.left!r} {self._symbol} {self.right!r})"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Intersection(_Combination):
    """Keys allowed by both patterns (`left & right`)."""

    _symbol = "&"
    _masks = staticmethod(ops.logical_and)
    _ranges = staticmethod(_intersect)
    _full = staticmethod(_logical_and)

    @staticmethod
    def _bands(left, right):
        # (A | S) & (B | T) lies in (A & B) | S | T: the bands meet, the strides stay.
        return None if left is None or right is None else Intersection(left, right)

    @property
    def may_empty_rows(self):
        return True  # each side may leave a row only keys the other excludes


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Union(_Combination):
    """Keys allowed by either pattern (`left | right`)."""

    _symbol = "|"
    _masks = staticmethod(ops.logical_or)
    _ranges = staticmethod(_unite)
    _full = staticmethod(_logical_or)

    @staticmethod
    def _bands(left, right):
        return right if left is None else left if right is None else Union(left, right)

    @property
    def may_empty_rows(self):
        return self.left.may_empty_rows and self.right.may_empty_rows


def _check_pattern(name, pattern):
    if not isinstance(pattern, Pattern):
        raise TypeError(f"`{name}` must be a keras_attn.patterns.Pattern. Received: {name}={pattern!r}")
    return pattern


def get(identifier, name="pattern"):
    """A `Pattern` from a pattern, its serialised config or `None` (which stays `None`)."""
    if identifier is None or isinstance(identifier, Pattern):
        return identifier
    if isinstance(identifier, dict):
        pattern = keras.saving.deserialize_keras_object(identifier)
        return _check_pattern(name, pattern)
    raise TypeError(
        f"`{name}` must be a keras_attn.patterns.Pattern, its config or None. Received: {name}={identifier!r}"
    )


def document_mask(query_segment_ids, key_segment_ids=None, pattern=None, query_offset=0):
    """Boolean `(batch, 1, query_len, key_len)`: `pattern` allows the pair and query and key share a document.

    The document mask of packed rows (several documents in one row, `keras_attn.core.segments`):
    int `(batch, length)` segment ids number the documents `1, 2, ...` and mark padding `0`, which
    attends to nothing and is attended by nothing. It composes with any pattern: `Causal()` becomes
    causal within each document, a `SlidingWindow` a window within it. Positions are the row's
    (query `i` at `query_offset + i`, key `j` at `j`), as for the patterns.

    Args:
        query_segment_ids: int `(batch, query_len)` document ids of the queries.
        key_segment_ids: int `(batch, key_len)` document ids of the keys; `None` (default) for
            self-attention, the query ids.
        pattern: an optional `Pattern` intersected with the document mask.
        query_offset: position of the first query among the keys (int or scalar int tensor).

    Example:

    >>> document_mask([[1, 1, 2, 2, 0]], pattern=Causal())[0, 0].numpy().astype(int).tolist()
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]]
    """
    query_ids = check_segment_ids("query_segment_ids", query_segment_ids)
    key_ids = query_ids if key_segment_ids is None else check_segment_ids("key_segment_ids", key_segment_ids)
    query_ids = query_ids[:, None, :, None]  # (batch, 1, query_len, 1)
    same = ops.logical_and(ops.equal(query_ids, key_ids[:, None, None, :]), ops.not_equal(query_ids, 0))
    if pattern is None:
        return same
    allowed = _check_pattern("pattern", pattern).block_mask(
        ops.shape(query_ids)[2], ops.shape(key_ids)[1], query_offset
    )  # (1, 1, query_len, key_len)
    return ops.logical_and(same, allowed)


def from_shorthands(pattern=None, is_causal=False, sliding_window=None):
    """`pattern` intersected with `Causal()` when `is_causal` and `SlidingWindow(w)` when given."""
    check_positive_int("sliding_window", sliding_window, allow_none=True)
    pattern = get(pattern)
    for implied in (Causal() if is_causal else None, None if sliding_window is None else SlidingWindow(sliding_window)):
        if implied is not None:
            pattern = implied if pattern is None else pattern & implied
    return pattern
