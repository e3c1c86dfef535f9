"""Linformer self-attention (Wang et al. 2020): keys and values projected along the length.

    output = softmax(Q (E K)^T / sqrt(d)) (F V),   E, F: (projected_length, length)

The `(seq, projected_length)` attention is linear in the length. Public implementations project
padded positions into every key; here the real tokens are first moved, in order, to the front
and the rest zeroed, so the projection only ever sees real tokens at positions `0..n-1`: padded
content, and how much padding follows, never change an output.

A causal request is refused: every projected key mixes the keys of the whole sequence, future
tokens included, so no mask over the projected keys can hide the future from a query. So is a
packed row (`segment_ids`), for the same reason: the projected keys mix every document of the row.
"""

import keras
from keras import ops

from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.families.projected_self_attention import ProjectedSelfAttention
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.utils import asserted
from keras_attn.utils import nan_unless
from keras_attn.validation import check_bool
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int

CAUSAL_ERROR = (
    "LinformerSelfAttention cannot be causal: each of its `projected_length` keys and values is a "
    "weighted sum over every position of the sequence, future positions included, so a query "
    "attending to any projected key already sees the future (a mask cannot remove a token's share "
    "of a mixture). Use LinearAttention(causal=True), LSHSelfAttention(causal=True) or a causal "
    "MultiHeadAttention instead."
)


def move_real_tokens_first(tensor, mask):
    """`(batch, seq, heads, depth)` with the unmasked positions first, in order, and zeros after.

    Args:
        tensor: `(batch, seq, heads, depth)`.
        mask: boolean `(batch, seq)`, `True` for real tokens.
    """
    length = ops.shape(tensor)[1]
    positions = ops.arange(length, dtype="int32")[None, :]  # (1, seq)
    # Real tokens sort by position, padding after all of them: one unique key per position.
    sort_keys = positions + ops.cast(ops.logical_not(mask), "int32") * length  # (batch, seq)
    order = ops.argsort(sort_keys, axis=-1)  # (batch, seq)
    moved = ops.take_along_axis(tensor, order[:, :, None, None], axis=1)  # (batch, seq, heads, depth)
    real = ops.sum(ops.cast(mask, "int32"), axis=-1, keepdims=True)  # (batch, 1)
    keep = ops.cast(positions < real, tensor.dtype)[:, :, None, None]  # (batch, seq, 1, 1)
    return moved * keep


@keras.saving.register_keras_serializable(package="keras_attn")
class LinformerSelfAttention(ProjectedSelfAttention):
    """Multi-head self-attention over keys and values projected to `projected_length` positions.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        **kwargs: `value_dim`, `output_dim`, `use_bias`, `kernel_initializer`, `bias_initializer`,
            `seed` as for every projected self-attention layer
            (`keras_attn.families.projected_self_attention.ProjectedSelfAttention`), and the base `Layer`'s.
        max_length: the longest sequence the layer takes; a shorter one uses the leading
            `length` rows of the length projections.
        projected_length: number of projected keys and values (Linformer's `k`).
        share_key_value: if `True`, one length projection serves keys and values.
        projection_per_head: if `True`, every head has its own length projections.
        projection_initializer: initializer of the `(max_length, projected_length)`
            projections; defaults to `N(0, 1 / projected_length)` (Wang et al.).
        causal: must be `False`; `True` raises a `ValueError` saying why.

    Call arguments: Keras's convention, self-attention only (see
    `keras_attn.families.projected_self_attention`):
        query: `(batch, seq, features)` with `seq <= max_length`; `value` and `key` are `None`
            (or `query`).
        query_mask: optional boolean `(batch, seq)`, the real query positions (the Keras mask
            of `query` when not given); a `False` one outputs exactly zero.
        value_mask, key_mask: optional boolean `(batch, seq)`, the real keys (each the Keras
            mask of `query` when not given); a position either marks `False` is removed before
            the length projection.
        use_causal_mask: must be `False` (a `ValueError` says why).
        return_attention_scores: if `True`, also return the softmax weights over the projected
            keys, `(batch, heads, seq, projected_length)` (not over the tokens: each projected
            key mixes them all).
        segment_ids: must be `None`: a packed row is refused (a `ValueError` says why).
        training: unused (no dropout).

    Example:

    >>> x = keras.random.normal((2, 300, 32))
    >>> layer = LinformerSelfAttention(num_heads=4, key_dim=8, max_length=512, projected_length=64)
    >>> tuple(layer(x).shape)
    (2, 300, 32)
    """

    capabilities = AttentionCapabilities(
        causal=False,
        cross=False,
        padding_mask=True,
        attention_mask=False,
        cache=None,
        scores=True,
        onnx=True,
        softmax=True,
        reasons=(
            ("causal", CAUSAL_ERROR),
            ("cross", "Its length projections are over the positions of the query sequence itself."),
            ("attention_mask", "A query attends to projected keys that mix every token: no per-token mask applies."),
            (
                "segments",
                "`segment_ids` cannot keep a packed row's documents apart: each projected key and value is a "
                "weighted sum over every position of the row, every document included, so a query attending "
                "to any of them already sees the other documents. Run each document as its own row.",
            ),
            (
                "cache",
                "Each new token changes every projected key and value (mixtures over all positions): nothing "
                "computed for earlier tokens can be kept, so it cannot decode incrementally.",
            ),
        ),
        scores_over_tokens=False,
    )

    def __init__(
        self,
        num_heads,
        key_dim,
        max_length,
        projected_length,
        share_key_value=False,
        projection_per_head=False,
        projection_initializer=None,
        causal=False,
        **kwargs,
    ):
        if check_bool("causal", causal):
            raise ValueError(f"{CAUSAL_ERROR} Received: causal={causal!r}")
        check_bool("share_key_value", share_key_value)
        check_bool("projection_per_head", projection_per_head)
        check_positive_int("max_length", max_length)
        check_positive_int("projected_length", projected_length)
        super().__init__(num_heads, key_dim, **kwargs)
        heads = {"num_heads": num_heads} if projection_per_head else {}
        check_elements("A length projection", **heads, max_length=max_length, projected_length=projected_length)
        self.max_length = max_length
        self.projected_length = projected_length
        self.share_key_value = share_key_value
        self.projection_per_head = projection_per_head
        self.projection_initializer = keras.initializers.get(
            projection_initializer or keras.initializers.RandomNormal(stddev=projected_length**-0.5, seed=self.seed)
        )

    def _build_rule(self, query_shape):
        self._check_length(query_shape[1])
        shape = (self.max_length, self.projected_length)
        if self.projection_per_head:
            shape = (self.num_heads,) + shape
        self.key_length_projection = self.add_weight(
            name="key_length_projection", shape=shape, initializer=self.projection_initializer
        )
        self.value_length_projection = self.key_length_projection
        if not self.share_key_value:
            self.value_length_projection = self.add_weight(
                name="value_length_projection", shape=shape, initializer=self.projection_initializer
            )

    def _check_length(self, length):
        """A `ValueError` naming `max_length` when a static sequence `length` exceeds it (the rows of the
        length projections); a length unknown until run time passes (`_project_length` asserts it)."""
        if length is not None and length > self.max_length:
            raise ValueError(
                f"`query` is longer than `max_length={self.max_length}` of {type(self).__name__} {self.name!r}. "
                f"Received: a sequence of length {length}"
            )

    def _project_length(self, tensor, projection):
        """`(batch, seq, heads, depth)` -> `(batch, projected_length, heads, depth)` by the leading `seq` rows."""
        length = ops.shape(tensor)[1]
        self._check_length(tensor.shape[1])  # a layer built for unknown lengths meets a known one eagerly
        fits = None
        if tensor.shape[1] is None:  # a dynamic length, checked at run time (NaN under XLA: `asserted`)
            fits = length <= self.max_length
            message = f"`query` is longer than `max_length={self.max_length}` of {type(self).__name__} {self.name!r}"
            length = asserted(
                fits, length, [message, "; the sequence's length and max_length:", length, self.max_length]
            )
        projection = ops.cast(projection, tensor.dtype)
        if self.projection_per_head:
            return nan_unless(fits, ops.einsum("bthd,htk->bkhd", tensor, projection[:, :length]))
        return nan_unless(fits, ops.einsum("bthd,tk->bkhd", tensor, projection[:length]))

    def _attend(self, query, key, value, key_mask, training, causal, return_weights, segment_ids):
        # `causal` is always False, `segment_ids` always None (`check_call` refuses them): the constructor refuses `causal=True`, `check_call` `use_causal_mask=True`.
        if key_mask is not None:
            key, value = move_real_tokens_first(key, key_mask), move_real_tokens_first(value, key_mask)
        key = self._project_length(key, self.key_length_projection)  # (batch, projected_length, heads, key_dim)
        value = self._project_length(value, self.value_length_projection)  # (batch, projected_length, heads, value_dim)
        # (batch, seq, heads, value_dim)[, (batch, heads, seq, projected_length)]
        if return_weights:
            return scaled_dot_product_attention(query, key, value, return_weights=True)
        return scaled_dot_product_attention(query, key, value), None

    def scores_key_length(self, query_shape):
        return self.projected_length

    def get_config(self):
        config = super().get_config()
        config.update(
            max_length=self.max_length,
            projected_length=self.projected_length,
            share_key_value=self.share_key_value,
            projection_per_head=self.projection_per_head,
            projection_initializer=keras.initializers.serialize(self.projection_initializer),
        )
        return config
