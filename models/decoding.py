"""Greedy and beam-search decoding for `models.translator.Translator`, cached or not.

Every tensor has a static shape: the token buffer is `(batch, max_length)` from the start and
one `while_loop` writes a token per step, so the search runs eagerly, under `tf.function` and
under `jit_compile=True` (XLA) alike.

Two step functions share one search:

- the cached step feeds only the newest token: each decoder block's self-attention updates the
  cache its family declares, from `TransformerDecoder.initial_self_attention_cache` (a key/value
  family writes the token's key/value into a `(batch, 2, max_length, heads, head_dim)` cache at
  the step index; a recurrent one, linear attention, adds it to its constant-size state), and the
  cross-attention keys/values of the encoder output are projected once before the loop;
- the uncached step re-runs the full causal decoder over the buffer and reads the logits at
  the step index (the reference the cached one must match token for token).
"""

import keras
import tensorflow as tf
from keras import ops

from keras_attn.blocks.transformer_decoder import compute_cross_attention_cache
from models.vocabulary import PADDING_ID

_NEGATIVE_INFINITY = -1e9


def _check_length(max_length, model):
    if not isinstance(max_length, int) or not 1 < max_length <= model.sequence_length:
        raise ValueError(
            f"`max_length` must be an int in (1, {model.sequence_length}]. Received: max_length={max_length!r}"
        )


def initial_self_caches(model, batch_size, max_length):
    """Each decoder block's empty self-attention cache: a zero key/value cache `(batch, 2,
    max_length, heads, head_dim)` or its family's recurrent state (`initial_self_attention_cache`)."""
    return [layer.initial_self_attention_cache(batch_size, max_length) for layer in model.decoder_layers]


def cross_attention_caches(model, encoder_output):
    """The encoder output's cross-attention keys/values, projected once per decoder block."""
    return [compute_cross_attention_cache(layer, encoder_output) for layer in model.decoder_layers]


def decoder_step(model, token, self_caches, cross_caches, source_padding_mask, index):
    """Logits `(batch, vocabulary)` for one token `(batch, 1)` at position `index`.

    Each block adds the token to its self-attention cache (a key/value cache at `index`, or a
    recurrent state) and attends over it (causally) and over its precomputed cross-attention cache.

    Returns:
        `(logits, updated_self_caches)`.
    """
    # A tensor `index` leaves the position slice's length unknown: restore the static width 1.
    hidden = ops.reshape(model.embed_target(token, start_index=index), (-1, 1, model.embedding_dim))
    token_mask = ops.not_equal(token, PADDING_ID)  # (batch, 1)
    updated = []
    for layer, self_cache, cross_cache in zip(model.decoder_layers, self_caches, cross_caches):
        hidden, self_cache, _ = layer(
            hidden,
            decoder_padding_mask=token_mask,
            encoder_padding_mask=source_padding_mask,
            self_attention_cache=self_cache,
            self_attention_cache_update_index=index,
            cross_attention_cache=cross_cache,
        )
        updated.append(self_cache)
    return model.project(hidden)[:, 0], updated  # (batch, vocabulary)


def cached_step(model, cross_caches, source_padding_mask):
    """`step(tokens, self_caches, index) -> (logits, self_caches)` feeding one token at a time."""

    def step(tokens, self_caches, index):
        token = ops.expand_dims(ops.take(tokens, index, axis=1), 1)  # (batch, 1), static width
        return decoder_step(model, token, self_caches, cross_caches, source_padding_mask, index)

    return step


def uncached_step(model, encoder_output, source_padding_mask):
    """`step(tokens, state, index) -> (logits, state)` re-running the full causal decoder."""

    def step(tokens, state, index):
        logits = model.decode(tokens, encoder_output, source_padding_mask)  # (batch, length, vocabulary)
        return ops.take(logits, index, axis=1), state  # (batch, vocabulary)

    return step


def _start_buffer(batch_size, max_length, start_id):
    tokens = ops.zeros((batch_size, max_length), "int32")
    start = ops.full((batch_size, 1), start_id, "int32")
    return ops.slice_update(tokens, (0, 0), start)  # (batch, max_length)


def greedy_search(step, state, batch_size, max_length, start_id, end_id):
    """Arg-max decoding; returns `(batch, max_length)` ids `[start] w1 .. [end] 0 ..`."""

    def keep_going(index, tokens, state, finished):
        return ops.logical_and(index < max_length - 1, ops.logical_not(ops.all(finished)))

    def advance(index, tokens, state, finished):
        logits, state = step(tokens, state, index)
        next_ids = ops.cast(ops.argmax(logits, axis=-1), "int32")  # (batch,)
        next_ids = ops.where(finished, PADDING_ID, next_ids)
        tokens = ops.slice_update(tokens, (0, index + 1), ops.expand_dims(next_ids, 1))
        return index + 1, tokens, state, ops.logical_or(finished, ops.equal(next_ids, end_id))

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        _start_buffer(batch_size, max_length, start_id),
        state,
        ops.zeros((batch_size,), "bool"),
    )
    return ops.while_loop(keep_going, advance, loop_vars)[1]


def _gather_rows(tree, rows):
    return keras.tree.map_structure(lambda tensor: ops.take(tensor, rows, axis=0), tree)


def beam_search(step, state, batch_size, max_length, start_id, end_id, beam_size, length_penalty=0.0):
    """Beam search over `beam_size` hypotheses per sentence.

    `step` and `state` must already hold `batch_size * beam_size` rows (beam-major within a
    sentence: rows `b * beam_size .. b * beam_size + beam_size - 1` belong to sentence `b`).
    A finished hypothesis keeps its score and only extends with padding. The best hypothesis
    maximises `log p / ((5 + length) / 6) ** length_penalty` (GNMT; 0 = raw log-probability).

    Returns:
        `(batch, max_length)` ids of the best hypothesis of each sentence.
    """
    rows = batch_size * beam_size
    first_beam_only = ops.concatenate(
        [ops.zeros((batch_size, 1)), ops.full((batch_size, beam_size - 1), _NEGATIVE_INFINITY)], axis=1
    )  # (batch, beam): all beams start identical, expand one
    sentence_offsets = ops.expand_dims(ops.arange(batch_size, dtype="int32") * beam_size, 1)

    def keep_going(index, tokens, state, scores, finished):
        return ops.logical_and(index < max_length - 1, ops.logical_not(ops.all(finished)))

    def advance(index, tokens, state, scores, finished):
        logits, state = step(tokens, state, index)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (rows, vocabulary)
        vocabulary = ops.shape(log_probs)[-1]
        only_padding = ops.where(
            ops.equal(ops.arange(vocabulary), PADDING_ID), 0.0, _NEGATIVE_INFINITY
        )  # (vocabulary,)
        log_probs = ops.where(ops.reshape(finished, (rows, 1)), only_padding, log_probs)
        candidates = ops.expand_dims(scores, -1) + ops.reshape(log_probs, (batch_size, beam_size, -1))
        scores, best = ops.top_k(ops.reshape(candidates, (batch_size, -1)), beam_size)  # (batch, beam)
        parents = ops.reshape(sentence_offsets + best // vocabulary, (rows,))
        next_ids = ops.reshape(ops.cast(best % vocabulary, "int32"), (rows, 1))
        tokens = ops.slice_update(ops.take(tokens, parents, axis=0), (0, index + 1), next_ids)
        finished = ops.logical_or(
            ops.take(ops.reshape(finished, (rows,)), parents, axis=0), ops.equal(next_ids[:, 0], end_id)
        )
        return index + 1, tokens, _gather_rows(state, parents), scores, ops.reshape(finished, (batch_size, beam_size))

    loop_vars = (
        ops.convert_to_tensor(0, "int32"),
        _start_buffer(rows, max_length, start_id),
        state,
        first_beam_only,
        ops.zeros((batch_size, beam_size), "bool"),
    )
    _, tokens, _, scores, _ = ops.while_loop(keep_going, advance, loop_vars)
    lengths = ops.sum(ops.cast(ops.not_equal(tokens, PADDING_ID), "float32"), axis=1) - 1.0  # (rows,)
    penalty = ops.power((5.0 + lengths) / 6.0, length_penalty)
    normalised = ops.reshape(ops.reshape(scores, (rows,)) / penalty, (batch_size, beam_size))
    best_rows = ops.reshape(sentence_offsets, (batch_size,)) + ops.cast(ops.argmax(normalised, axis=1), "int32")
    return ops.take(tokens, best_rows, axis=0)  # (batch, max_length)


def _repeat_rows(tensor, times):
    return tensor if times == 1 else ops.repeat(tensor, times, axis=0)


def translate_ids(
    model, source_ids, start_id, end_id, max_length=None, beam_size=1, use_cache=True, length_penalty=0.0
):
    """Decodes zero-padded `source_ids` `(batch, source_len)` into target ids.

    Args:
        model: a built `Translator`.
        source_ids: int `(batch, source_len)`; padding (id 0) never changes the result.
        start_id, end_id: the target `[start]` and `[end]` ids.
        max_length: length of the output buffer including `[start]`; defaults to the model's
            `sequence_length`.
        beam_size: 1 for greedy search, more for beam search.
        use_cache: decode with the key/value cache (`True`) or with full decoder passes.
        length_penalty: GNMT length-penalty exponent for beam search.

    Returns:
        int32 `(batch, max_length)`: `[start]`, the tokens, `[end]`, then padding.
    """
    max_length = model.sequence_length if max_length is None else max_length
    _check_length(max_length, model)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"`beam_size` must be a positive int. Received: beam_size={beam_size!r}")
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    source_ids = _repeat_rows(source_ids, beam_size)  # (batch * beam, source_len)
    encoder_output = model.encode(source_ids)
    source_padding_mask = model.source_padding_mask(source_ids)
    rows = batch_size * beam_size
    if use_cache:
        step = cached_step(model, cross_attention_caches(model, encoder_output), source_padding_mask)
        state = initial_self_caches(model, rows, max_length)
    else:
        step, state = uncached_step(model, encoder_output, source_padding_mask), ()
    if beam_size == 1:
        return greedy_search(step, state, batch_size, max_length, start_id, end_id)
    return beam_search(step, state, batch_size, max_length, start_id, end_id, beam_size, length_penalty)


def make_decoder(model, vectorizers, beam_size=1, jit_compile=False, use_cache=True, length_penalty=0.0):
    """A `tf.function` mapping `(batch, sequence_length)` source ids to target ids (see `translate_ids`)."""

    @tf.function(
        jit_compile=jit_compile,
        input_signature=[tf.TensorSpec((None, vectorizers.sequence_length), tf.int32)],
    )
    def decode(source_ids):
        return translate_ids(
            model,
            source_ids,
            vectorizers.start_id,
            vectorizers.end_id,
            beam_size=beam_size,
            use_cache=use_cache,
            length_penalty=length_penalty,
        )

    return decode


def decode_sentences(decoder, vectorizers, sentences, batch_size=256):
    """Target token lists for `sentences`, decoded `batch_size` at a time."""
    tokens = []
    for begin in range(0, len(sentences), batch_size):
        ids = decoder(vectorizers.source_ids(sentences[begin : begin + batch_size])).numpy()
        tokens.extend(vectorizers.target_tokens(row) for row in ids)
    return tokens
