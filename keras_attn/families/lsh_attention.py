"""LSH self-attention (Reformer, Kitaev et al. 2020): attention within buckets of similar tokens.

Queries and keys share one projection; keys are the queries scaled to unit length. In each of
`num_hashes` rounds, random rotations hash every key into one of `num_buckets` buckets
(`argmax([x R, -x R])`), tokens are sorted by (bucket, position), the sorted sequence is cut into
chunks of `chunk_size`, and each chunk attends to itself and the previous chunk. The rounds'
outputs are combined with weights from their log-sum-exp, as if attention ran over the union of
the keys every round found. Memory is linear in the length: `seq * 2 * chunk_size` logits per
head and round.

The rules public implementations skip:

- causal attention depends on the past only: a token attends to the `chunk_size` latest tokens
  of its own bucket, itself included (which future tokens cannot change, unlike the chunk the
  sort puts it in);
- padding is hashed into a bucket of its own (sorted after every real token) and is never
  attended; padded rows output zeros;
- a token attends to itself only when nothing else is allowed (its own logit gets
  `SELF_LOGIT`, far below any real logit and far above a masked one);
- rotations are a non-trainable weight drawn from `seed`: hashing is deterministic at inference
  and saved with the model;
- any length: the sequence is padded internally to a whole number of chunks;
- packed rows (`segment_ids`): tokens sort by (document, bucket, position), so each document's
  buckets lie together, and a key of another document is never attended (masked inside the
  windows). A document whose length and packed start are whole numbers of chunks therefore gets
  exactly the chunks, and the outputs, it gets alone; causal, the `chunk_size` latest tokens of
  its own bucket in its own document, whatever the lengths.
"""

import keras
import tensorflow as tf
from keras import ops

from keras_attn.core.masks import zero_masked
from keras_attn.core.softmax import default_scale
from keras_attn.core.softmax import fill_masked
from keras_attn.core.softmax import softmax
from keras_attn.families.document_runs import document_bounds
from keras_attn.families.projected_self_attention import ProjectedSelfAttention
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.utils import float_math_dtype
from keras_attn.utils import padding_to_multiple
from keras_attn.validation import check_bool
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int

# The logit of a token's own key: attended only when every other key is masked (Reformer).
SELF_LOGIT = -1e5


def hash_buckets(keys, rotations, num_buckets):
    """Angular LSH buckets `(batch, heads, hashes, seq)` of `keys` `(batch, seq, heads, depth)`.

    Args:
        rotations: `(heads, depth, hashes, num_buckets // 2)` random projections.
        num_buckets: 1 (every token in bucket 0) or an even number.
    """
    # (batch, heads, hashes, seq, buckets / 2)
    rotated = ops.einsum("bthd,hdrk->bhrtk", keys, ops.cast(rotations, keys.dtype))
    if num_buckets == 1:
        return ops.zeros(ops.shape(rotated)[:-1], "int32")
    # tf.argmax, not keras.ops.argmax: Keras tells -0.0 from 0.0 with a Bitcast, an op ONNX does not have
    # (tf.argmax, like NumPy, takes the first of equal values).
    return tf.argmax(ops.concatenate([rotated, -rotated], axis=-1), axis=-1, output_type="int32")


def _gather(tensor, order):
    """`tensor` `(batch, heads, seq, d)` in the order `(batch, heads, hashes, seq)`: `(batch, heads, hashes, seq, d)`."""
    return ops.take_along_axis(ops.expand_dims(tensor, 2), ops.expand_dims(order, -1), axis=3)


def _with_previous_chunk(chunks):
    """`(..., chunks, chunk, d)` -> `(..., chunks, 2 * chunk, d)`: the previous chunk, then the chunk itself."""
    previous = ops.concatenate([ops.zeros_like(chunks[..., :1, :, :]), chunks[..., :-1, :, :]], axis=-3)
    return ops.concatenate([previous, chunks], axis=-2)


def _sort_keys(buckets, valid, num_buckets, segment_ids):
    """Int32 `(batch, heads, hashes, seq)` whose ascending order is (document, bucket, position), masked tokens last.

    A token at position `p` of a document starting at `s` with `n` tokens gets `(num_buckets + 1) * s +
    bucket * n + p`, inside `[(num_buckets + 1) * s, (num_buckets + 1) * (s + n))`: the documents' ranges
    are disjoint and in row order, with no product of two lengths (int32 holds any length's keys).
    Without `segment_ids` the row is one document.
    """
    length = ops.shape(valid)[1]
    positions = ops.arange(length, dtype="int32")[None, :]  # (1, seq)
    if segment_ids is None:
        start, size = ops.zeros_like(positions), ops.full_like(positions, length)
    else:
        start, end = document_bounds(segment_ids)  # (batch, seq)
        size = end - start + 1
    start, size, offset = (ops.expand_dims(ops.expand_dims(t, 1), 1) for t in (start, size, positions - start))
    in_document = (num_buckets + 1) * start + buckets * size + offset
    masked_last = (num_buckets + 1) * length + ops.expand_dims(ops.expand_dims(positions, 1), 1)
    return ops.where(valid[:, None, None, :], in_document, masked_last)


def lsh_attention(
    query,
    value,
    rotations,
    num_buckets,
    chunk_size,
    mask=None,
    is_causal=False,
    return_weights=False,
    segment_ids=None,
):
    """Reformer attention of shared query/keys; returns `(batch, seq, heads, value_dim)`.

    Args:
        query: `(batch, seq, heads, depth)`; the keys are these vectors at unit length.
        value: `(batch, seq, heads, value_dim)`.
        rotations: `(heads, depth, hashes, num_buckets // 2)`.
        num_buckets: number of hash buckets (1 or even).
        chunk_size: sorted tokens per chunk; each chunk attends to itself and the previous one.
        mask: optional boolean padding mask `(batch, seq)`.
        is_causal: if `True`, a token attends only to the `chunk_size` latest tokens of its own
            bucket up to itself.
        return_weights: if `True`, also return the weights `(batch, heads, seq, seq)` the output
            is made of: each round's probabilities scattered back to the key positions, weighted
            by the round's share of the total mass (a key found by several rounds gets the sum),
            zero for every key outside the query's buckets. Quadratic in the length.
        segment_ids: optional int `(batch, seq)` documents of a packed row (0: padding): buckets
            within each document, never a key of another one.

    Returns:
        The output, and the weights when `return_weights` (`output == weights @ value`).
    """
    dtype = float_math_dtype(query.dtype)
    batch, length = ops.shape(query)[0], ops.shape(query)[1]
    heads, depth, value_dim = query.shape[2], query.shape[3], value.shape[3]
    padding = padding_to_multiple(length, chunk_size)
    padded_length = length + padding
    num_chunks = padded_length // chunk_size
    valid = ops.ones((batch, length), "bool") if mask is None else ops.cast(mask, "bool")
    if segment_ids is not None:
        segment_ids = ops.pad(ops.cast(segment_ids, "int32"), [[0, 0], [0, padding]])  # (batch, padded_length)
        valid = valid & ops.not_equal(segment_ids[:, :length], 0)
    valid = ops.pad(valid, [[0, 0], [0, padding]], constant_values=False)  # (batch, padded_length)
    query = ops.pad(ops.cast(query, dtype), [[0, 0], [0, padding], [0, 0], [0, 0]])
    value = ops.pad(ops.cast(value, dtype), [[0, 0], [0, padding], [0, 0], [0, 0]])
    key = query / ops.maximum(ops.norm(query, axis=-1, keepdims=True), 1e-6)  # (batch, padded_length, heads, depth)

    buckets = hash_buckets(key, rotations, num_buckets)  # (batch, heads, hashes, padded_length)
    buckets = ops.where(valid[:, None, None, :], buckets, num_buckets)  # padding: a bucket of its own
    order = ops.argsort(_sort_keys(buckets, valid, num_buckets, segment_ids), axis=-1)  # (batch, heads, hashes, seq)
    hashes = ops.shape(order)[2]

    def sorted_chunks(tensor):  # (batch, seq, heads, d) -> (batch, heads, hashes, chunks, chunk, d)
        gathered = _gather(ops.transpose(tensor, (0, 2, 1, 3)), order)
        return ops.reshape(gathered, (batch, heads, hashes, num_chunks, chunk_size, tensor.shape[-1]))

    sorted_query, sorted_key, sorted_value = sorted_chunks(query), sorted_chunks(key), sorted_chunks(value)
    sorted_positions = ops.reshape(order, (batch, heads, hashes, num_chunks, chunk_size))
    sorted_valid = ops.take_along_axis(ops.broadcast_to(valid[:, None, None, :], ops.shape(order)), order, axis=-1)
    sorted_valid = ops.reshape(sorted_valid, (batch, heads, hashes, num_chunks, chunk_size))
    window_key = _with_previous_chunk(sorted_key)  # (batch, heads, hashes, chunks, 2 * chunk, depth)
    window_value = _with_previous_chunk(sorted_value)  # (batch, heads, hashes, chunks, 2 * chunk, value_dim)
    window_positions = _with_previous_chunk(sorted_positions[..., None])[..., 0]  # (..., chunks, 2 * chunk)
    window_valid = _with_previous_chunk(ops.cast(sorted_valid, "int32")[..., None])[..., 0] > 0
    first_chunk_has_no_previous = ops.concatenate(
        [ops.arange(num_chunks)[:, None] > 0, ops.ones((num_chunks, 1), "bool")], axis=-1
    )  # (chunks, 2): [previous part, own part]
    window_valid = window_valid & ops.repeat(first_chunk_has_no_previous, chunk_size, axis=-1)

    if is_causal:
        # The `chunk_size` latest tokens of the query's own bucket, itself included: these lie in
        # its window and depend on earlier tokens only (future tokens may shift the sort).
        sorted_buckets = ops.reshape(
            ops.take_along_axis(buckets, order, axis=-1), (batch, heads, hashes, num_chunks, chunk_size)
        )
        window_buckets = _with_previous_chunk(sorted_buckets[..., None])[..., 0]  # (..., chunks, 2 * chunk)
        rank = ops.reshape(ops.arange(padded_length, dtype="int32"), (num_chunks, chunk_size))
        window_rank = _with_previous_chunk(rank[..., None])[..., 0]  # (chunks, 2 * chunk)
        behind = rank[..., :, None] - window_rank[..., None, :]  # (chunks, chunk, 2 * chunk), sorted distance
        recent = (behind >= 0) & (behind < chunk_size)
        same_bucket = sorted_buckets[..., :, None] == window_buckets[..., None, :]

    scale = ops.cast(default_scale(depth), dtype)
    # (batch, heads, hashes, chunks, chunk, 2 * chunk)
    logits = ops.einsum("...cd,...ed->...ce", sorted_query * scale, window_key)
    query_positions, key_positions = sorted_positions[..., :, None], window_positions[..., None, :]
    allowed = window_valid[..., None, :] & sorted_valid[..., :, None]  # (..., chunk, 2 * chunk)
    if segment_ids is not None:  # a window may reach into the previous document's chunk
        sorted_segments = ops.reshape(
            ops.take_along_axis(ops.broadcast_to(segment_ids[:, None, None, :], ops.shape(order)), order, axis=-1),
            (batch, heads, hashes, num_chunks, chunk_size),
        )
        window_segments = _with_previous_chunk(sorted_segments[..., None])[..., 0]  # (..., chunks, 2 * chunk)
        allowed = allowed & (sorted_segments[..., :, None] == window_segments[..., None, :])
    if is_causal:
        allowed = allowed & recent & same_bucket
    logits = ops.where(key_positions == query_positions, ops.cast(SELF_LOGIT, dtype), logits)
    logits = fill_masked(logits, allowed)
    log_sum_exp = ops.logsumexp(logits, axis=-1)  # (batch, heads, hashes, chunks, chunk)
    weights = zero_masked(ops.exp(logits - log_sum_exp[..., None]), allowed)
    # (batch, heads, hashes, chunks, chunk, value_dim)
    attended = ops.einsum("...ce,...ed->...cd", weights, window_value)

    # Back to the original order, then the rounds weighted by their share of the total mass.
    undo = ops.argsort(order, axis=-1)  # (batch, heads, hashes, padded_length)
    attended = ops.take_along_axis(
        ops.reshape(attended, (batch, heads, hashes, padded_length, value_dim)), undo[..., None], axis=3
    )
    log_sum_exp = ops.take_along_axis(ops.reshape(log_sum_exp, (batch, heads, hashes, padded_length)), undo, axis=-1)
    round_weights = softmax(log_sum_exp, axis=2)  # (batch, heads, hashes, padded_length)
    output = ops.sum(attended * round_weights[..., None], axis=2)  # (batch, heads, padded_length, value_dim)
    output = ops.transpose(output, (0, 2, 1, 3))[:, :length]  # (batch, seq, heads, value_dim)
    real_rows = ops.cast(valid[:, :length], dtype)  # (batch, seq)
    output = output * real_rows[:, :, None, None]
    if not return_weights:
        return output
    # Each window weight to its key's position: (batch, heads, hashes, chunks, chunk, padded_length)
    scattered = ops.einsum("...ce,...ej->...cj", weights, ops.one_hot(window_positions, padded_length, dtype=dtype))
    scattered = ops.reshape(scattered, (batch, heads, hashes, padded_length, padded_length))  # sorted queries
    scattered = ops.take_along_axis(scattered, undo[..., None], axis=3)  # queries in their own order
    full = ops.sum(scattered * round_weights[..., None], axis=2)[:, :, :length, :length]  # (batch, heads, seq, seq)
    return output, full * real_rows[:, None, :, None]


@keras.saving.register_keras_serializable(package="keras_attn")
class LSHSelfAttention(ProjectedSelfAttention):
    """Reformer's locality-sensitive-hashing self-attention, memory linear in the length.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key (queries and keys are shared: there is no
            key projection).
        **kwargs: `value_dim`, `output_dim`, `use_bias`, `kernel_initializer`, `bias_initializer`,
            `seed` as for every projected self-attention layer
            (`keras_attn.families.projected_self_attention.ProjectedSelfAttention`), and the base `Layer`'s.
        num_buckets: hash buckets per round, 1 or even (Reformer: about `seq / chunk_size`).
        num_hashes: hashing rounds; more rounds, fewer missed neighbours.
        chunk_size: sorted tokens per chunk; each chunk attends to itself and the previous one.
        causal: if `True`, token `i` attends only to tokens `j <= i`: to the `chunk_size`
            latest tokens of its own bucket (itself included), a set no future token changes
            (Reformer's plain chunk windows would let a future token, which shifts the sort,
            change which past keys a token sees).

    Call arguments: Keras's convention, self-attention only (see
    `keras_attn.families.projected_self_attention`):
        query: `(batch, seq, features)`, any `seq`; `value` and `key` are `None` (or `query`).
        query_mask: optional boolean `(batch, seq)`, the real query positions (the Keras mask
            of `query` when not given); a `False` one outputs exactly zero.
        value_mask, key_mask: optional boolean `(batch, seq)`, the real keys (each the Keras
            mask of `query` when not given); a position either marks `False` is never attended
            and is hashed into the padding's own bucket, so as a query it finds no key either
            and outputs zero.
        use_causal_mask: if `True`, this call is causal as with `causal=True`.
        return_attention_scores: if `True`, also return the weights `(batch, heads, seq, seq)`:
            each round's softmax probabilities scattered back to the key positions and weighted
            by the round's share of the mass, as the output combines them (a key two rounds find
            gets both shares); zero outside the query's buckets; a real row sums to 1. Quadratic
            in the length: for looking, not for long inputs.
        segment_ids: optional int `(batch, seq)`, the documents of a packed row (0: padding,
            output zero): each token attends only within its own document, hashed and chunked
            with it (exactly as alone when each document's length and start are whole numbers of
            `chunk_size`; causal, whatever they are).
        training: unused (no dropout).

    Example:

    >>> x = keras.random.normal((2, 1000, 32))
    >>> layer = LSHSelfAttention(num_heads=4, key_dim=8, num_buckets=16, chunk_size=64, seed=0)
    >>> tuple(layer(x).shape)
    (2, 1000, 32)
    """

    shares_query_key = True
    capabilities = AttentionCapabilities(
        causal=True,
        cross=False,
        padding_mask=True,
        attention_mask=False,
        cache=None,
        scores=True,
        onnx=True,
        softmax=True,
        segments=True,
        reasons=(
            ("cross", "Queries and keys are one shared projection of the same sequence (Reformer)."),
            ("attention_mask", "Which keys a query sees is decided by hashing, not by a mask over every pair."),
            ("cache", "The buckets of past tokens change with every new token's sort; there is no cache."),
        ),
    )

    def __init__(self, num_heads, key_dim, num_buckets=32, num_hashes=2, chunk_size=64, causal=False, **kwargs):
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("num_hashes", num_hashes)
        check_positive_int("chunk_size", chunk_size)
        check_bool("causal", causal)
        if num_buckets != 1 and num_buckets % 2:
            raise ValueError(
                "`num_buckets` must be 1 or even (buckets are the argmax over [x R, -x R]). "
                f"Received: num_buckets={num_buckets}"
            )
        super().__init__(num_heads, key_dim, **kwargs)
        check_elements(
            "The random rotations",
            num_heads=num_heads,
            key_dim=key_dim,
            num_hashes=num_hashes,
            num_buckets=num_buckets,  # half of them: the rotations give the rest by sign
        )
        self.num_buckets = num_buckets
        self.num_hashes = num_hashes
        self.chunk_size = chunk_size
        self.causal = causal

    def _build_rule(self, query_shape):
        self.rotations = self.add_weight(
            name="rotations",
            shape=(self.num_heads, self.key_dim, self.num_hashes, max(self.num_buckets // 2, 1)),
            initializer=keras.initializers.RandomNormal(seed=self.seed_generator),
            trainable=False,
            dtype="float32",
        )

    def _attend(self, query, key, value, key_mask, training, causal, return_weights, segment_ids):
        result = lsh_attention(
            query,
            value,
            self.rotations,
            self.num_buckets,
            self.chunk_size,
            mask=key_mask,
            is_causal=causal,
            return_weights=return_weights,
            segment_ids=segment_ids,
        )
        return result if return_weights else (result, None)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_buckets=self.num_buckets, num_hashes=self.num_hashes, chunk_size=self.chunk_size, causal=self.causal
        )
        return config
