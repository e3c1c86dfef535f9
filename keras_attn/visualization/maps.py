"""One attention map per layer and example: weights `(heads, query_len, key_len)` with their tokens.

`focus` shrinks a long map for display: a window of queries and the keys that receive the most
attention in it (kept in their order), so a 2,048-token review never becomes a 2,048-label axis.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class AttentionMap:
    """The weights of one attention layer for one example.

    Attributes:
        name: the layer's path.
        weights: float32 `(heads, query_len, key_len)`.
        query_tokens: `query_len` labels of the query positions.
        key_tokens: `key_len` labels of the key positions.
        query_positions: the positions the rows come from in the full map (after `focus`).
        key_positions: the positions the columns come from in the full map.
    """

    name: str
    weights: np.ndarray
    query_tokens: tuple
    key_tokens: tuple
    query_positions: tuple = None
    key_positions: tuple = None

    def __post_init__(self):
        weights = np.asarray(self.weights, np.float32)
        if weights.ndim != 3:
            raise ValueError(
                f"`weights` of {self.name!r} must be (heads, query_len, key_len). Received: shape={weights.shape}"
            )
        _, query_len, key_len = weights.shape
        for argument, tokens, length in (
            ("query_tokens", self.query_tokens, query_len),
            ("key_tokens", self.key_tokens, key_len),
        ):
            if len(tokens) != length:
                raise ValueError(
                    f"`{argument}` of {self.name!r} must have one label per position ({length}). "
                    f"Received: {len(tokens)} labels"
                )
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "query_tokens", tuple(str(token) for token in self.query_tokens))
        object.__setattr__(self, "key_tokens", tuple(str(token) for token in self.key_tokens))
        for name, length in (("query_positions", query_len), ("key_positions", key_len)):
            positions = getattr(self, name)
            object.__setattr__(
                self, name, tuple(range(length)) if positions is None else tuple(int(p) for p in positions)
            )

    @property
    def num_heads(self):
        return self.weights.shape[0]


def attention_maps(weights, query_tokens, key_tokens=None, example=0):
    """`AttentionMap`s of one example from `attention_weights`' dict, real tokens only.

    Args:
        weights: `{layer path: (batch, heads, query_len, key_len)}`.
        query_tokens: the example's real query tokens (its padding left out); or a dict
            `{layer path: tokens}` when layers differ.
        key_tokens: the same for keys; `None` means the query tokens (self-attention).
        example: which row of the batch.

    Returns:
        A list of `AttentionMap`, one per layer, cut to `len(query_tokens) x len(key_tokens)`:
        what is cut is padding, whose weights are zero (masked keys, fully masked queries).
    """
    maps = []
    for name, layer_weights in weights.items():
        queries = query_tokens[name] if isinstance(query_tokens, dict) else query_tokens
        keys = queries if key_tokens is None else (key_tokens[name] if isinstance(key_tokens, dict) else key_tokens)
        if not 0 <= example < layer_weights.shape[0]:
            raise ValueError(f"`example` must be in [0, {layer_weights.shape[0]}). Received: example={example}")
        if len(queries) > layer_weights.shape[2] or len(keys) > layer_weights.shape[3]:
            raise ValueError(
                f"More tokens than positions for {name!r}: {len(queries)} query and {len(keys)} key "
                f"tokens for weights of shape {layer_weights.shape}"
            )
        maps.append(AttentionMap(name, layer_weights[example, :, : len(queries), : len(keys)], queries, keys))
    return maps


def focus(attention_map, max_queries=64, max_keys=64, query_start=0):
    """A smaller `AttentionMap`: queries `[query_start, query_start + max_queries)` and their top keys.

    The keys kept are the `max_keys` that receive the most attention (summed over heads and the
    kept queries), in their original order; a map already small enough is returned as is.
    """
    for argument, value in (("max_queries", max_queries), ("max_keys", max_keys)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"`{argument}` must be a positive int. Received: {argument}={value!r}")
    _, query_len, key_len = attention_map.weights.shape
    if not 0 <= query_start < max(query_len, 1):
        raise ValueError(f"`query_start` must be in [0, {query_len}). Received: query_start={query_start}")
    if query_len <= max_queries and key_len <= max_keys:
        return attention_map
    rows = np.arange(query_start, min(query_start + max_queries, query_len))
    window = attention_map.weights[:, rows]  # (heads, kept_queries, key_len)
    received = window.sum(axis=(0, 1))  # (key_len,)
    columns = np.sort(np.argsort(-received, kind="stable")[:max_keys])
    return AttentionMap(
        attention_map.name,
        window[:, :, columns],
        [attention_map.query_tokens[i] for i in rows],
        [attention_map.key_tokens[j] for j in columns],
        query_positions=np.asarray(attention_map.query_positions)[rows],
        key_positions=np.asarray(attention_map.key_positions)[columns],
    )
