"""Linear (kernel) attention: `phi(Q) (phi(K)^T V)` instead of `softmax(Q K^T) V`.

Katharopoulos et al. (2020), "Transformers are RNNs", with `phi = elu + 1`; Choromanski et al.
(2021), "Rethinking Attention with Performers", with FAVOR+ positive orthogonal random features,
`phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)`, whose inner products estimate `exp(q . k)`.

    output_i = phi(q_i) . S_i / phi(q_i) . z_i,   S_i = sum_j phi(k_j) v_j^T,  z_i = sum_j phi(k_j)

with `j` over every key (non-causal) or `j <= i` (causal). The parts the public implementations get
wrong, and what this module does instead:

- causal is exact per token: the sequence is cut into chunks, each query sees the prefix sum of
  the earlier chunks' `phi(k) v^T` and, inside its own chunk, only the keys at or before it (a
  lower-triangular `(chunk, chunk)` product), never a bidirectional chunk;
- no statistic over other tokens: FAVOR+'s query stabiliser is the query's own maximum (it
  cancels in its own ratio) and the key offset comes from the random features alone (since
  `w . k - |k|^2 / 2 <= |w|^2 / 2`), so a future token never changes a past output;
- masked keys have `phi(k) = 0` and contribute nothing; masked queries output zeros; a query
  with no key gets zeros, not NaN;
- features and sums are float32 whatever the compute dtype (fp16 sums overflow after a few
  thousand tokens);
- cached decoding carries the `(features, value_dim)` state `S` and the `(features,)` state
  `z`: memory constant in the number of decoded tokens;
- a long causal input (static length over `RECOMPUTE_SEGMENT_LENGTH`) runs segment by segment,
  the state passed along, each segment's features, prefix sums and in-chunk products recomputed
  in the backward pass (`tf.recompute_grad`): forward + backward holds one segment's
  intermediates at a time instead of the whole sequence's (benchmarks/attention_families_scaling.py
  reports the memory);
- packed rows (`segment_ids`, a document a run of one id): the sums and the causal state restart at
  each document (`packed_linear_attention`: in-chunk products masked to the document, the sums
  carried across chunks restarted where a document ends), exactly what each document gets alone;
  a decoding state then carries its document's id, and a step of another document starts afresh.
"""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_attn.core.masks import zero_masked
from keras_attn.core.segments import segment_mask
from keras_attn.core.softmax import mask_fill
from keras_attn.families.projected_self_attention import ProjectedSelfAttention
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.layers.capabilities import describe
from keras_attn.utils import float_math_dtype
from keras_attn.utils import padding_to_multiple
from keras_attn.validation import check_bool
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int

FEATURE_MAPS = ("elu", "favor")
# FAVOR+ key features are at most `exp(max |w|^2 / 2 - offset)`; this bound keeps a float32 sum
# over 65,536 keys times values far from overflow while small logits stay far from underflow.
FAVOR_MAX_KEY_LOG_FEATURE = 40.0
# Causal inputs longer than this (static length) are split into segments of this many tokens whose
# intermediates are recomputed in the backward pass.
RECOMPUTE_SEGMENT_LENGTH = 8192


def elu_feature_map(x):
    """`elu(x) + 1`: positive features, `(..., depth)` -> `(..., depth)`."""
    return ops.elu(x) + 1.0


def orthogonal_random_features(num_features, depth, seed, dtype="float32"):
    """FAVOR+ projection `(num_features, depth)`: blocks of orthogonal rows with chi-distributed norms.

    Each block of `depth` rows is the `Q` of a Gaussian matrix's QR decomposition; row norms are
    redrawn as the norms of Gaussian vectors, so every row is marginally `N(0, I)` (Choromanski et
    al. 2021, section 4).
    """
    blocks = []
    for _ in range(math.ceil(num_features / depth)):
        gaussian = keras.random.normal((depth, depth), dtype=dtype, seed=seed)
        orthogonal, _ = ops.qr(gaussian)  # (depth, depth), orthonormal columns
        blocks.append(ops.transpose(orthogonal))
    rows = ops.concatenate(blocks, axis=0)[:num_features]  # (num_features, depth)
    norms = ops.norm(keras.random.normal((num_features, depth), dtype=dtype, seed=seed), axis=-1)
    return rows * ops.expand_dims(norms, -1)


def favor_feature_map(x, projection, is_query):
    """FAVOR+ positive random features `(..., depth)` -> `(..., num_features)`, float32.

    `x` must already carry the `depth ** -0.25` scale. A query row is divided by its own largest
    feature (it cancels in its own ratio); every key is divided by one constant from the
    projection alone, never by a statistic over other tokens.
    """
    # A matmul: TensorFlow 2.18's oneDNN einsum gets `"...d,md->...m"` wrong past one row.
    projected = ops.matmul(x, ops.transpose(projection))  # (..., num_features)
    log_features = projected - 0.5 * ops.sum(ops.square(x), axis=-1, keepdims=True)
    if is_query:
        offset = ops.stop_gradient(ops.max(log_features, axis=-1, keepdims=True, initial=mask_fill(log_features.dtype)))
    else:
        bound = 0.5 * ops.max(ops.sum(ops.square(projection), axis=-1))  # >= every key's log-feature
        offset = ops.stop_gradient(ops.maximum(bound - FAVOR_MAX_KEY_LOG_FEATURE, 0.0))
    num_features = ops.cast(ops.shape(projection)[0], x.dtype)
    return ops.exp(log_features - offset) / ops.sqrt(num_features)


def _ratio(numerator, denominator):
    """`numerator / denominator[..., None]`, zero where the denominator is 0 (a query with no key)."""
    has_keys = ops.expand_dims(denominator > 0, -1)
    safe = ops.where(denominator > 0, denominator, ops.ones_like(denominator))
    return zero_masked(numerator / ops.expand_dims(safe, -1), has_keys)


def linear_attention(query_features, key_features, value):
    """Non-causal linear attention through the `(features, value_dim)` summary of all keys.

    Args:
        query_features, key_features: `(batch, seq, heads, features)`, non-negative.
        value: `(batch, seq, heads, value_dim)`.

    Returns:
        `(batch, seq, heads, value_dim)`.
    """
    summary = ops.einsum("bthm,bthd->bhmd", key_features, value)  # (batch, heads, features, value_dim)
    normaliser = ops.sum(key_features, axis=1)  # (batch, heads, features)
    numerator = ops.einsum("bthm,bhmd->bthd", query_features, summary)  # (batch, seq, heads, value_dim)
    denominator = ops.einsum("bthm,bhm->bth", query_features, normaliser)  # (batch, seq, heads)
    return _ratio(numerator, denominator)


def causal_linear_attention(query_features, key_features, value, chunk_size, state=None):
    """Causal linear attention, exact per token, through prefix sums over chunks.

    Args:
        query_features, key_features: `(batch, seq, heads, features)`, non-negative.
        value: `(batch, seq, heads, value_dim)`.
        chunk_size: tokens per chunk (any `seq`: the last chunk is padded with zero features).
        state: optional `(summary, normaliser)` of earlier tokens, `(batch, heads, features,
            value_dim)` and `(batch, heads, features)` (cached decoding).

    Returns:
        `(output, (summary, normaliser))`: the output `(batch, seq, heads, value_dim)` and the
        state after the last token.
    """
    batch, length = ops.shape(value)[0], ops.shape(value)[1]
    heads, features, value_dim = value.shape[2], query_features.shape[-1], value.shape[-1]
    padding = padding_to_multiple(length, chunk_size)
    num_chunks = (length + padding) // chunk_size

    def chunks(tensor):  # (batch, seq, heads, d) -> (batch, chunks, chunk, heads, d)
        tensor = ops.pad(tensor, [[0, 0], [0, padding], [0, 0], [0, 0]])
        return ops.reshape(tensor, (batch, num_chunks, chunk_size, heads, tensor.shape[-1]))

    query_chunks, key_chunks, value_chunks = chunks(query_features), chunks(key_features), chunks(value)
    chunk_summary = ops.einsum("bnchm,bnchd->bnhmd", key_chunks, value_chunks)  # (batch, chunks, heads, m, d)
    chunk_normaliser = ops.sum(key_chunks, axis=2)  # (batch, chunks, heads, m)
    summary_through = ops.cumsum(chunk_summary, axis=1)  # (batch, chunks, heads, m, d), inclusive
    normaliser_through = ops.cumsum(chunk_normaliser, axis=1)  # (batch, chunks, heads, m)
    if state is None:
        state = (
            ops.zeros((batch, heads, features, value_dim), value.dtype),
            ops.zeros((batch, heads, features), value.dtype),
        )
    initial_summary, initial_normaliser = (ops.cast(s, value.dtype) for s in state)
    # The earlier chunks' sums: shift the inclusive prefix by one chunk, start from the state.
    summary_before = ops.concatenate([ops.zeros_like(summary_through[:, :1]), summary_through[:, :-1]], axis=1)
    summary_before = summary_before + initial_summary[:, None]  # (batch, chunks, heads, m, d)
    normaliser_before = (
        ops.concatenate([ops.zeros_like(normaliser_through[:, :1]), normaliser_through[:, :-1]], axis=1)
        + initial_normaliser[:, None]
    )  # (batch, chunks, heads, m)

    numerator = ops.einsum("bnchm,bnhmd->bnchd", query_chunks, summary_before)  # (batch, chunks, chunk, heads, d)
    denominator = ops.einsum("bnchm,bnhm->bnch", query_chunks, normaliser_before)  # (batch, chunks, chunk, heads)
    scores = ops.einsum("bnchm,bnehm->bnhce", query_chunks, key_chunks)  # (batch, chunks, heads, chunk, chunk)
    at_or_before = ops.tril(ops.ones((chunk_size, chunk_size), scores.dtype))  # (chunk, chunk): key e <= query c
    scores = scores * at_or_before
    numerator = numerator + ops.einsum("bnhce,bnehd->bnchd", scores, value_chunks)
    denominator = denominator + ops.transpose(ops.sum(scores, axis=-1), (0, 1, 3, 2))
    output = _ratio(numerator, denominator)  # (batch, chunks, chunk, heads, d)
    output = ops.reshape(output, (batch, num_chunks * chunk_size, heads, value_dim))[:, :length]
    final_state = (summary_through[:, -1] + initial_summary, normaliser_through[:, -1] + initial_normaliser)
    return output, final_state


def _times(weights, tensor):
    """`tensor` `(batch, chunks, ...)` times `weights` `(batch, chunks)` broadcast over its trailing axes."""
    return tensor * ops.cast(_trailing(weights, tensor), tensor.dtype)


def _document_carries(key_chunks, value_chunks, segment_chunks, state, state_segment):
    """What each chunk's first document summed in the chunks before it, and the state after the last chunk.

    A document is a run of one id, so only the document of a chunk's first token can have keys in
    earlier chunks. Its carry is the previous chunk's carry (when that whole chunk is the same
    document) plus the previous chunk's keys of its last document (when that document goes on): a
    cumulative sum restarted where a document ends, read as the prefix sum minus the prefix sum
    before the restart (linear in the length, unlike a chunk-by-chunk matrix).

    Args:
        key_chunks: `(batch, chunks, chunk, heads, features)`, zero for masked keys.
        value_chunks: `(batch, chunks, chunk, heads, value_dim)`.
        segment_chunks: int32 `(batch, chunks, chunk)`.
        state: `(summary, normaliser)` of earlier tokens, those of the document `state_segment`
            (int32 `(batch,)`): they carry into the first chunk when its first token goes on with it.

    Returns:
        `(carries, final_state)`: the carried `(summary, normaliser)`, `(batch, chunks, heads,
        features, value_dim)` and `(batch, chunks, heads, features)`, and those of the last token's
        document after the last token.
    """
    first, last = segment_chunks[:, :, 0], segment_chunks[:, :, -1]  # (batch, chunks)
    of_last = ops.cast(segment_chunks == last[..., None], key_chunks.dtype)  # (batch, chunks, chunk)
    last_sums = (
        ops.einsum("bnchm,bnchd,bnc->bnhmd", key_chunks, value_chunks, of_last),
        ops.einsum("bnchm,bnc->bnhm", key_chunks, of_last),
    )
    goes_on = ops.concatenate([state_segment[:, None] == first[:, :1], last[:, :-1] == first[:, 1:]], axis=1)
    whole_before = ops.concatenate([ops.zeros_like(goes_on[:, :1]), first[:, :-1] == last[:, :-1]], axis=1)
    restarts = ops.logical_not(goes_on & whole_before)  # (batch, chunks): the previous carry does not go on
    carries = tuple(
        _restarting_cumsum(_times(goes_on, ops.concatenate([initial[:, None], last_sum[:, :-1]], axis=1)), restarts)
        for initial, last_sum in zip(state, last_sums)
    )
    whole_last = first[:, -1:] == last[:, -1:]  # (batch, 1)
    final = tuple(
        _times(whole_last, carry[:, -1:])[:, 0] + last_sum[:, -1] for carry, last_sum in zip(carries, last_sums)
    )
    return carries, final


def _restarting_cumsum(values, restarts):
    """The cumulative sum of `values` `(batch, chunks, ...)` along the chunks, restarted where `restarts`
    `(batch, chunks)` is `True` (that chunk's value starts a new sum).

    By doubling shifts (a segmented Hillis-Steele scan, log2(chunks) elementwise steps, XLA and ONNX
    friendly): each sum only ever adds its own run's values, so a document's sums never carry the
    rounding of another document's, as a prefix sum minus an earlier prefix sum would.
    """
    count = values.shape[1]
    restarts = tf.cast(restarts, tf.int32)  # not bool: ONNX pads no bool tensor inside a loop

    def double(shift, values, restarts):
        earlier = tf.pad(values, [[0, 0], [shift, 0]] + [[0, 0]] * (len(values.shape) - 2))[:, : tf.shape(values)[1]]
        earlier_restarts = tf.pad(restarts, [[0, 0], [shift, 0]], constant_values=1)[:, : tf.shape(restarts)[1]]
        values = tf.where(_trailing(restarts > 0, values), values, values + earlier)
        return shift * 2, values, tf.maximum(restarts, earlier_restarts)

    if count is None:
        return tf.while_loop(lambda shift, *_: shift < tf.shape(values)[1], double, (tf.constant(1), values, restarts))[
            1
        ]
    shift = 1
    while shift < count:
        shift, values, restarts = double(shift, values, restarts)
    return values


def _trailing(mask, tensor):
    """`mask` `(batch, chunks)` with one axis of size 1 for each further axis of `tensor`."""
    for _ in range(len(tensor.shape) - 2):
        mask = mask[..., None]
    return mask


def packed_linear_attention(
    query_features, key_features, value, segment_ids, chunk_size, is_causal, state=None, state_segment=None
):
    """Linear attention over a packed row: each query's sums hold only its own document's keys.

    Chunked as `causal_linear_attention`: inside a chunk, the `(chunk, chunk)` products masked to the
    query's document (and to keys at or before it when causal); across chunks, the carried sums of
    the document that enters the chunk (`_document_carries`), and when not causal those of the
    document that leaves it, from the same carries over the reversed row.

    Args:
        query_features, key_features: `(batch, seq, heads, features)`, non-negative (masked keys zero).
        value: `(batch, seq, heads, value_dim)`.
        segment_ids: int32 `(batch, seq)`; a document is a run of one id.
        chunk_size: tokens per chunk.
        is_causal: whether key `j` counts for query `i` only when `j <= i`.
        state: causal only: optional `(summary, normaliser)` of earlier tokens, those of the document
            `state_segment` (int32 `(batch,)`); a first token of another document starts afresh.

    Returns:
        `(output, final_state)`: `(batch, seq, heads, value_dim)` and the `(summary, normaliser)` of
        the last token's document after it.
    """
    batch, length = ops.shape(value)[0], ops.shape(value)[1]
    heads, features, value_dim = value.shape[2], query_features.shape[-1], value.shape[-1]
    padding = padding_to_multiple(length, chunk_size)
    num_chunks = (length + padding) // chunk_size
    segment_ids = ops.cast(segment_ids, "int32")
    last_id = segment_ids[:, -1:]  # (batch, 1)
    # The padded tail continues the last document with zero features: it changes no sum.
    segment_ids = ops.pad(segment_ids - last_id, [[0, 0], [0, padding]]) + last_id

    def chunks(tensor):  # (batch, seq, ...) -> (batch, chunks, chunk, ...)
        if tensor.dtype != segment_ids.dtype:
            tensor = ops.pad(tensor, [[0, 0], [0, padding], [0, 0], [0, 0]])
        return ops.reshape(tensor, (batch, num_chunks, chunk_size, *tensor.shape[2:]))

    query_chunks, key_chunks, value_chunks, segment_chunks = (
        chunks(t) for t in (query_features, key_features, value, segment_ids)
    )
    empty = (
        (ops.zeros((batch, heads, features, value_dim), value.dtype), ops.zeros((batch, heads, features), value.dtype)),
        ops.zeros((batch,), "int32"),
    )
    if state is None:
        state, state_segment = empty
    state = tuple(ops.cast(part, value.dtype) for part in state)
    carries, final_state = _document_carries(key_chunks, value_chunks, segment_chunks, state, state_segment)
    # Each query reads the carry of the document entering its chunk when it is of that document.
    reads = [(carries, segment_chunks == segment_chunks[:, :, :1])]
    if not is_causal:  # and the keys after its chunk, the carries of the reversed row
        # One axis at a time: Keras 3.10's TensorFlow `flip` takes no tuple of axes.
        flipped = (ops.flip(ops.flip(t, axis=1), axis=2) for t in (key_chunks, value_chunks, segment_chunks))
        after, _ = _document_carries(*flipped, *empty)
        reads.append((tuple(ops.flip(t, axis=1) for t in after), segment_chunks == segment_chunks[:, :, -1:]))
    numerator = denominator = 0.0
    for (summary, normaliser), of_document in reads:
        of_document = ops.cast(of_document, query_chunks.dtype)[..., None]  # (batch, chunks, chunk, 1)
        numerator += ops.einsum("bnchm,bnhmd->bnchd", query_chunks, summary) * of_document[..., None]
        denominator += ops.einsum("bnchm,bnhm->bnch", query_chunks, normaliser) * of_document
    scores = ops.einsum("bnchm,bnehm->bnhce", query_chunks, key_chunks)  # (batch, chunks, heads, chunk, chunk)
    allowed = segment_chunks[:, :, :, None] == segment_chunks[:, :, None, :]  # (batch, chunks, chunk, chunk)
    if is_causal:
        allowed = allowed & ops.cast(ops.tril(ops.ones((chunk_size, chunk_size))), "bool")
    scores = scores * ops.cast(allowed, scores.dtype)[:, :, None]
    numerator = numerator + ops.einsum("bnhce,bnehd->bnchd", scores, value_chunks)
    denominator = denominator + ops.transpose(ops.sum(scores, axis=-1), (0, 1, 3, 2))
    output = _ratio(numerator, denominator)  # (batch, chunks, chunk, heads, value_dim)
    return ops.reshape(output, (batch, num_chunks * chunk_size, heads, value_dim))[:, :length], final_state


def normalised_kernel_weights(query_features, key_features, is_causal=False, segment_ids=None):
    """The weights linear attention implies: `phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`.

    Quadratic in the length (it is what `linear_attention` never builds): for looking at the
    attention, not for running it. A row without any key (its sum is 0) is all zero.

    Args:
        query_features, key_features: `(batch, seq, heads, features)`, non-negative (masked keys
            already zero).
        is_causal: if `True`, key `j` counts for query `i` only when `j <= i`.
        segment_ids: optional int `(batch, seq)`: key `j` counts for query `i` only in its document.

    Returns:
        `(batch, heads, query_len, key_len)`, each row summing to 1 over its keys (or all zero).
    """
    scores = ops.einsum("bqhm,bkhm->bhqk", query_features, key_features)
    if is_causal:
        scores = scores * ops.tril(ops.ones(ops.shape(scores)[-2:], scores.dtype))
    if segment_ids is not None:
        scores = scores * ops.cast(segment_mask(segment_ids, segment_ids), scores.dtype)
    total = ops.sum(scores, axis=-1)  # (batch, heads, query_len)
    return _ratio(scores, total)


@keras.saving.register_keras_serializable(package="keras_attn")
class LinearAttention(ProjectedSelfAttention):
    """Multi-head linear self-attention (elu+1 or FAVOR+), time and memory linear in the length.

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        **kwargs: `value_dim`, `output_dim`, `use_bias`, `kernel_initializer`, `bias_initializer`,
            `seed` as for every projected self-attention layer
            (`keras_attn.families.projected_self_attention.ProjectedSelfAttention`), and the base `Layer`'s.
        feature_map: `"elu"` (`elu(x) + 1`, Katharopoulos et al.) or `"favor"` (FAVOR+ positive
            orthogonal random features, Performer; an estimate of softmax attention).
        num_random_features: FAVOR+ features per head; defaults to `2 * key_dim`.
        redraw_features: FAVOR+ only: if `True`, every training call draws fresh random features
            (Performer's redrawing); inference always uses the stored ones (a non-trainable
            weight, saved with the model, so inference is deterministic).
        causal: if `True`, token `i` attends to tokens `j <= i`, exactly, per token.
        chunk_size: tokens per chunk of the causal prefix sums (memory `seq * features *
            value_dim / chunk_size` per head for the sums, `seq * chunk_size` for the in-chunk
            products).

    Call arguments: Keras's convention, self-attention only (see
    `keras_attn.families.projected_self_attention`):
        query: `(batch, seq, features)`; `value` and `key` are `None` (or `query`).
        query_mask: optional boolean `(batch, seq)`, the real query positions (the Keras mask
            of `query` when not given); a `False` one outputs exactly zero.
        value_mask, key_mask: optional boolean `(batch, seq)`, the real keys (each the Keras
            mask of `query` when not given); a position either marks `False` contributes
            nothing as a key.
        use_causal_mask: if `True`, this call is causal as with `causal=True`.
        return_attention_scores: if `True`, also return the normalised kernel weights the
            output is made of, `phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`,
            `(batch, heads, seq, seq)` (lower-triangular when causal). They are quadratic in
            the length, which the attention itself never is: for looking, not for long inputs.
        segment_ids: optional int `(batch, seq)`, the documents of a packed row (0: padding,
            output zero): each token's sums (and causal state) hold only its own document's keys.
        training: whether FAVOR+ features are redrawn (with `redraw_features`).
        cache: causal only: the recurrent state `(summary, normaliser)` of the tokens decoded
            so far, `(batch, heads, features, value_dim)` and `(batch, heads, features)` float32
            (`initial_cache(batch)` gives the empty one); with `segment_ids`, the state of
            `initial_cache(batch, segments=True)`, which also holds its document's id. With a
            cache the call returns `(output, new_cache)` (no scores: the state keeps no per-token keys).

    Example:

    >>> x = keras.random.normal((2, 100, 32))
    >>> layer = LinearAttention(num_heads=4, key_dim=8, feature_map="favor", causal=True)
    >>> tuple(layer(x).shape)
    (2, 100, 32)
    >>> cache = layer.initial_cache(2)
    >>> step, cache = layer(x[:, :1], cache=cache)  # one token at a time, constant memory
    """

    capabilities = AttentionCapabilities(
        causal=True,
        cross=False,
        padding_mask=True,
        attention_mask=False,
        cache="recurrent",
        scores=True,
        onnx=True,
        softmax=False,
        segments=True,
        reasons=(
            ("cross", "Its queries and keys are projections of the same sequence."),
            ("attention_mask", "Keys are summed into one state per query: only padding and causality apply."),
        ),
    )

    def __init__(
        self,
        num_heads,
        key_dim,
        feature_map="elu",
        num_random_features=None,
        redraw_features=False,
        causal=False,
        chunk_size=64,
        **kwargs,
    ):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"`feature_map` must be one of {FEATURE_MAPS}. Received: feature_map={feature_map!r}")
        check_positive_int("num_random_features", num_random_features, allow_none=True)
        check_positive_int("chunk_size", chunk_size)
        check_bool("redraw_features", redraw_features)
        check_bool("causal", causal)
        if redraw_features and feature_map != "favor":
            raise ValueError(
                "`redraw_features=True` needs random features (`feature_map='favor'`). "
                f"Received: feature_map={feature_map!r}, redraw_features={redraw_features!r}"
            )
        super().__init__(num_heads, key_dim, **kwargs)
        check_elements("The random features", num_random_features=num_random_features, key_dim=key_dim)
        self.feature_map = feature_map
        self.num_random_features = num_random_features
        self.redraw_features = redraw_features
        self.causal = causal
        self.chunk_size = chunk_size

    @property
    def num_features(self):
        """Features per head: `key_dim` for elu+1, the random features for FAVOR+."""
        if self.feature_map == "elu":
            return self.key_dim
        return self.num_random_features or 2 * self.key_dim

    def _build_rule(self, query_shape):
        if self.feature_map == "favor":
            self.random_features = self.add_weight(
                name="random_features",
                shape=(self.num_features, self.key_dim),
                initializer=lambda shape, dtype=None: orthogonal_random_features(
                    shape[0], shape[1], self.seed_generator
                ),
                trainable=False,
                dtype="float32",
            )

    def initial_cache(self, batch_size, segments=False):
        """The empty recurrent state for cached decoding: `(summary, normaliser)` zeros, float32.

        With `segments=True`, for decoding packed rows (calls with `segment_ids`), a third part: the
        int32 `(batch,)` document the state belongs to (0: none yet). A step whose first token has
        another id starts afresh, and the state returned is that of the step's last token's document.
        """
        check_bool("segments", segments)
        state = (
            ops.zeros((batch_size, self.num_heads, self.num_features, self.value_dim), "float32"),
            ops.zeros((batch_size, self.num_heads, self.num_features), "float32"),
        )
        return state + (ops.zeros((batch_size,), "int32"),) if segments else state

    def features(self, query, key, training=False):
        """`(query_features, key_features)`, `(batch, seq, heads, features)` in float32 (float64 for float64)."""
        return self._features(query, key, self._feature_projection(query.dtype, training))

    def _feature_projection(self, dtype, training):
        """FAVOR+'s `(num_features, key_dim)` projection for this call (redrawn in training if asked); `None` for elu+1."""
        if self.feature_map == "elu":
            return None
        dtype = float_math_dtype(dtype)
        if training and self.redraw_features:
            return orthogonal_random_features(self.num_features, self.key_dim, self.seed_generator, dtype)
        return ops.cast(self.random_features, dtype)

    def _features(self, query, key, projection):
        """Float32 (float64 for float64) features of `query` and `key` under `projection` (`None`: elu+1)."""
        dtype = float_math_dtype(query.dtype)
        query, key = ops.cast(query, dtype), ops.cast(key, dtype)
        if projection is None:
            return elu_feature_map(query), elu_feature_map(key)
        scale = ops.cast(self.key_dim**-0.25, dtype)  # q . k / sqrt(depth), split between the two
        return (
            favor_feature_map(query * scale, projection, is_query=True),
            favor_feature_map(key * scale, projection, is_query=False),
        )

    def _call_with_cache(
        self, query, query_mask, key_mask, causal, training, cache, return_attention_scores, segment_ids
    ):
        if not causal:
            raise ValueError(
                "A recurrent `cache` is for causal decoding: the layer has causal=False and the call "
                f"use_causal_mask=False. Received a cache with causal={self.causal}"
            )
        if return_attention_scores:
            raise ValueError(
                "`return_attention_scores=True` with a recurrent `cache`: the state keeps no per-token keys to "
                f"weigh. Received: return_attention_scores=True, cache shapes={describe(cache)}"
            )
        self._check_state(cache, query, segment_ids)
        query, key, value = self.project(query, query_mask, key_mask)
        projection = self._feature_projection(query.dtype, training)
        attended, new_cache = self._attend_with_state(query, key, value, key_mask, projection, True, cache, segment_ids)
        # The state holds the earlier keys: only the query mask decides which of these rows are real.
        return self._finish(attended, None, query_mask, False), new_cache

    def _check_state(self, cache, inputs, segment_ids):
        """A `ValueError` unless `cache` is a state of `initial_cache` for this batch, with its document
        (`segments=True`) exactly when the call has `segment_ids`."""
        expected = ((self.num_heads, self.num_features, self.value_dim), (self.num_heads, self.num_features))
        if segment_ids is not None:
            expected += ((),)
        shapes = (
            tuple(tuple(getattr(part, "shape", ())) for part in cache) if isinstance(cache, (list, tuple)) else None
        )
        batch = inputs.shape[0]
        valid = (
            shapes is not None
            and len(shapes) == len(expected)
            and all(
                len(shape) == len(want) + 1 and shape[1:] == want and (batch is None or shape[0] in (None, batch))
                for shape, want in zip(shapes, expected)
            )
        )
        if not valid:
            document = ", and the int32 `(batch,)` document of a packed row's state" if segment_ids is not None else ""
            raise ValueError(
                "`cache` must be the recurrent state `(summary, normaliser)` of shapes "
                f"(batch, {self.num_heads}, {self.num_features}, {self.value_dim}) and (batch, {self.num_heads}, "
                f"{self.num_features}){document}, batch = {batch} (see `initial_cache`"
                f"{'(batch, segments=True)' if segment_ids is not None else ''}). "
                f"Received: cache shapes={shapes or type(cache).__name__}, segment_ids.shape={describe(segment_ids)}"
            )

    def _attend(self, query, key, value, key_mask, training, causal, return_weights, segment_ids):
        projection = self._feature_projection(query.dtype, training)
        attended, _ = self._attend_with_state(query, key, value, key_mask, projection, causal, None, segment_ids)
        if not return_weights:
            return attended, None
        query_features, key_features = self._features(query, key, projection)
        if key_mask is not None:
            key_features = key_features * ops.cast(key_mask, key_features.dtype)[:, :, None, None]  # padded keys: zero
        return attended, normalised_kernel_weights(query_features, key_features, causal, segment_ids)

    def _attend_with_state(self, query, key, value, key_mask, projection, causal, state, segment_ids):
        keep = None if key_mask is None else ops.cast(key_mask, float_math_dtype(query.dtype))[:, :, None, None]
        length = query.shape[1]
        if length == 0:  # nothing to attend: an empty output, the state unchanged
            return ops.zeros(
                (ops.shape(query)[0], 0, self.num_heads, self.value_dim), float_math_dtype(query.dtype)
            ), state
        if causal and length is not None and length > RECOMPUTE_SEGMENT_LENGTH:
            return self._attend_in_segments(query, key, value, keep, projection, state, segment_ids)
        return self._feature_attention(query, key, value, keep, projection, causal, state, segment_ids)

    def _feature_attention(self, query, key, value, keep, projection, causal, state, segment_ids):
        """`(attended (batch, seq, heads, value_dim), state)`: features, the key mask `keep`, then the linear rule
        (with `segment_ids`, the packed rule and a state `(summary, normaliser, document)`)."""
        query_features, key_features = self._features(query, key, projection)
        value = ops.cast(value, query_features.dtype)
        if keep is not None:
            key_features = key_features * keep  # masked keys contribute nothing
        if segment_ids is not None:
            sums, document = (None, None) if state is None else (state[:2], state[2])
            attended, sums = packed_linear_attention(
                query_features, key_features, value, segment_ids, self.chunk_size, causal, sums, document
            )
            return attended, (*sums, segment_ids[:, -1])
        if causal:
            return causal_linear_attention(query_features, key_features, value, self.chunk_size, state)
        return linear_attention(query_features, key_features, value), state

    def _attend_in_segments(self, query, key, value, keep, projection, state, segment_ids):
        """Causal attention over `RECOMPUTE_SEGMENT_LENGTH`-token segments, recomputed in the backward pass.

        The same sums as one pass (the state carries every earlier segment, and its document with
        `segment_ids`), in segment order.
        """
        batch, length = ops.shape(query)[0], query.shape[1]
        dtype = float_math_dtype(query.dtype)
        if state is None:
            state = self.initial_cache(batch, segments=segment_ids is not None)
        # Document ids travel as floats (exact for any id below 2**24): recompute_grad differentiates every input.
        state = tuple(ops.cast(s, dtype) for s in state)
        if keep is None:
            keep = ops.ones((batch, length, 1, 1), dtype)
        documents = () if segment_ids is None else (ops.cast(segment_ids, dtype),)
        extra = () if projection is None else (projection,)

        packed, state_size = segment_ids is not None, len(state)

        @tf.recompute_grad
        def segment(segment_query, segment_key, segment_value, segment_keep, *carried):
            # `carried`: the state's parts, then the segment's document ids when packed, then FAVOR+'s projection.
            state, rest = carried[:state_size], carried[state_size:]
            if packed:
                state = (*state[:2], ops.cast(state[2], "int32"))
            attended, state = self._feature_attention(
                segment_query,
                segment_key,
                segment_value,
                segment_keep,
                rest[packed] if extra else None,
                True,
                state,
                ops.cast(rest[0], "int32") if packed else None,
            )
            # The state first: its gradient comes from the next segment, so the recomputations run one
            # at a time, last segment first (recompute_grad waits for the first output's gradient).
            return *(ops.cast(part, dtype) for part in state), attended

        sizes = [RECOMPUTE_SEGMENT_LENGTH] * (length // RECOMPUTE_SEGMENT_LENGTH)
        sizes += [length % RECOMPUTE_SEGMENT_LENGTH] if length % RECOMPUTE_SEGMENT_LENGTH else []
        # split, not slices: a slice's gradient is a whole-length tensor per segment.
        pieces = zip(*(tf.split(tensor, sizes, axis=1) for tensor in (query, key, value, keep, *documents)))
        outputs = []
        for piece in pieces:
            *state, attended = segment(*piece[:4], *state, *piece[4:], *extra)
            outputs.append(attended)  # (batch, segment, heads, value_dim)
        if packed:
            state[2] = ops.cast(state[2], "int32")
        return ops.concatenate(outputs, axis=1), tuple(state)

    def get_config(self):
        config = super().get_config()
        config.update(
            feature_map=self.feature_map,
            num_random_features=self.num_random_features,
            redraw_features=self.redraw_features,
            causal=self.causal,
            chunk_size=self.chunk_size,
        )
        return config
