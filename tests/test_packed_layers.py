"""Packed rows through `MultiHeadAttention`, its subclasses, `TransformerEncoder` and `TransformerDecoder` (issue #39).

Oracle: each document run alone in its own row through the same layer (same weights). A packed row's outputs at
a document's tokens, the gradients with respect to every weight (summed over the documents, as the loss is) and
with respect to the inputs at those tokens equal the documents' own, in float32, mixed_float16 (looser) and under
XLA. The padding of a packed row (id 0) holds NaN here: it reaches no real output and no gradient, the attention
layers output exactly 0 there (the encoder and decoder blocks, finite values: their residual and feed-forward run on
every row, `tests/test_padding_guarantees.py`). Cached decoding of a packed prompt continues its last document as
that document alone, and a token of an earlier document attends to that document only.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import CausalSelfAttention
from keras_attn import CrossAttention
from keras_attn import LinearAttention
from keras_attn import LinformerSelfAttention
from keras_attn import MultiHeadAttention
from keras_attn import SelfAttention
from keras_attn import TransformerDecoder
from keras_attn import TransformerEncoder
from tests.layer_checks import MIXED_PRECISION_TOLERANCES

FEATURES, HEADS, KEY_DIM = 8, 2, 4
# Two packed rows of 10 tokens: documents of 3, 4 and 2 tokens then padding; 6 and 2 tokens then padding.
SEGMENT_IDS = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 0], [5, 5, 5, 5, 5, 5, 7, 7, 0, 0]], "int32")
# Encoder rows for cross-attention, the same documents (ids) with other lengths and another packing.
ENCODER_IDS = np.array([[1, 1, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0], [5, 5, 5, 7, 7, 7, 7, 7, 0, 0, 0, 0]], "int32")
ATOL = {"float32": 2e-5, **MIXED_PRECISION_TOLERANCES}


def documents(ids):
    """`{(row, id): (start, end)}`: where each document of a packed `(batch, length)` id array lies."""
    spans = {}
    for row, row_ids in enumerate(ids):
        for position, document in enumerate(row_ids):
            if document:
                start, _ = spans.get((row, document), (position, position))
                spans[(row, document)] = (start, position + 1)
    return spans


def packed_inputs(ids, seed, features=FEATURES):
    """Random float32 features `(batch, length, features)` with NaN at the padding (id 0)."""
    x = np.random.default_rng(seed).normal(size=(*ids.shape, features)).astype("float32")
    x[ids == 0] = np.nan
    return x


def outputs_and_gradients(fn, inputs, output_gradient, variables, jit_compile):
    """`fn(*inputs)`, then the gradients of `sum(output * output_gradient)` for `variables` and for the inputs."""

    def compute(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            output = fn(*tensors)
            loss = tf.reduce_sum(tf.cast(output, "float32") * output_gradient)
        gradients = tape.gradient(loss, [*variables, *tensors])
        return output, gradients[: len(variables)], gradients[len(variables) :]

    if jit_compile:
        compute = tf.function(compute, jit_compile=True)
    return compute(*(tf.constant(tensor) for tensor in inputs))


def assert_close(actual, expected, atol, what):
    actual, expected = np.asarray(actual, "float64"), np.asarray(expected, "float64")
    tolerance = atol * max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, atol=tolerance, rtol=0, err_msg=what)


def assert_packed_equals_alone(packed, alone, inputs, spans, variables, policy="float32", jit_compile=False):
    """`packed(*inputs)` against `alone(*document slices)` for each document (eagerly: `jit_compile` compiles
    the packed call only, each document's length would be one more compilation).

    Args:
        packed: the packed call, `inputs` in, `(batch, length, features)` out over `inputs[0]`'s tokens.
        alone: the call of one document alone: its slice of each input in.
        inputs: the packed inputs, NaN at their padding.
        spans: `{document: [(row, start, end) for each input]}`.
        variables: the weights whose gradients are compared.

    Returns:
        The packed output, for the caller's padding checks.
    """
    rng = np.random.default_rng(0)
    length = inputs[0].shape[1]
    query_tokens = np.zeros(inputs[0].shape[:2], bool)
    for (row, start, end), *_ in spans.values():
        query_tokens[row, start:end] = True
    # The loss reads the documents' tokens only: what the blocks output at padding is not a document's.
    output_gradient = rng.normal(size=(*inputs[0].shape[:2], FEATURES)).astype("float32") * query_tokens[..., None]
    output, weight_gradients, input_gradients = outputs_and_gradients(
        packed, inputs, output_gradient, variables, jit_compile
    )
    expected_weight_gradients = [np.zeros(v.shape, "float64") for v in variables]
    atol = ATOL[policy]
    for document, slices in spans.items():
        pieces = [tensor[row : row + 1, start:end] for tensor, (row, start, end) in zip(inputs, slices)]
        row, start, end = slices[0]
        alone_output, alone_weight_gradients, alone_input_gradients = outputs_and_gradients(
            alone, pieces, output_gradient[row : row + 1, start:end], variables, jit_compile=False
        )
        assert_close(output[row : row + 1, start:end], alone_output, atol, f"{policy} output of document {document}")
        for tensor_gradient, alone_gradient, (row, start, end) in zip(input_gradients, alone_input_gradients, slices):
            assert_close(tensor_gradient[row : row + 1, start:end], alone_gradient, atol, f"input gradient {document}")
        for total, gradient in zip(expected_weight_gradients, alone_weight_gradients):
            total += np.asarray(gradient, "float64")
    for variable, got, want in zip(variables, weight_gradients, expected_weight_gradients):
        assert_close(got, want, atol, f"{policy} gradient of {variable.path}")
    for tensor, gradient in zip(inputs, input_gradients):
        padding = np.isnan(tensor).any(axis=-1)
        assert np.all(np.asarray(gradient)[padding] == 0.0), "a padding token got a gradient"
    assert np.all(np.isfinite(output)), "padding NaN reached an output"
    assert length == output.shape[1]
    return np.asarray(output)


def self_attention_spans(ids):
    return {document: [(row, start, end)] for (row, document), (start, end) in documents(ids).items()}


def cross_attention_spans(query_ids, key_ids):
    keys = documents(key_ids)
    return {
        document: [(row, start, end), (row, *keys[(row, document)])]
        for (row, document), (start, end) in documents(query_ids).items()
    }


def with_policy(policy, build):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        return build()
    finally:
        keras.config.set_dtype_policy(previous)


MODES = [("float32", False), ("mixed_float16", False), ("float32", True)]
MODE_IDS = ["float32", "mixed_float16", "xla"]


@pytest.mark.parametrize("policy, jit_compile", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_multi_head_self_attention_of_a_packed_row_is_each_document_alone(policy, jit_compile, causal):
    keras.utils.set_random_seed(1)
    layer = with_policy(policy, lambda: MultiHeadAttention(HEADS, KEY_DIM))
    ids = tf.constant(SEGMENT_IDS)
    output = assert_packed_equals_alone(
        lambda x: layer(x, x, use_causal_mask=causal, segment_ids=ids),
        lambda x: layer(x, x, use_causal_mask=causal),
        [packed_inputs(SEGMENT_IDS, seed=2)],
        self_attention_spans(SEGMENT_IDS),
        layer.trainable_variables,
        policy,
        jit_compile,
    )
    assert np.all(output[SEGMENT_IDS == 0] == 0.0), "a padding query must output exactly 0"


# A layer with cross-attention, the names of its query and key segment-ids arguments, and whether it outputs
# exactly 0 at padding (an attention layer does; a block adds its residual and feed-forward there).
CROSS_ATTENTION_LAYERS = {
    "cross_attention": (lambda: CrossAttention(HEADS, KEY_DIM), ("query_segment_ids", "key_segment_ids"), True),
    "decoder": (lambda: TransformerDecoder(16, HEADS), ("decoder_segment_ids", "encoder_segment_ids"), False),
}


@pytest.mark.parametrize("policy, jit_compile", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind", CROSS_ATTENTION_LAYERS)
def test_cross_attention_of_packed_rows_matches_each_document_with_its_own_keys(policy, jit_compile, kind):
    keras.utils.set_random_seed(3)
    build, (query_argument, key_argument), zero_at_padding = CROSS_ATTENTION_LAYERS[kind]
    layer = with_policy(policy, build)
    documents_kwargs = {query_argument: tf.constant(SEGMENT_IDS), key_argument: tf.constant(ENCODER_IDS)}
    output = assert_packed_equals_alone(
        lambda q, v: layer(q, v, **documents_kwargs),
        lambda q, v: layer(q, v),
        [packed_inputs(SEGMENT_IDS, seed=4), packed_inputs(ENCODER_IDS, seed=5, features=6)],
        cross_attention_spans(SEGMENT_IDS, ENCODER_IDS),
        layer.trainable_variables,
        policy,
        jit_compile,
    )
    if zero_at_padding:
        assert np.all(output[SEGMENT_IDS == 0] == 0.0)


@pytest.mark.parametrize("layer_class", [SelfAttention, CausalSelfAttention])
def test_self_attention_subclasses_take_segment_ids_with_keras_masks(layer_class):
    # A query mask and a Keras mask combine with the documents: a masked token is padding too.
    keras.utils.set_random_seed(6)
    layer = layer_class(HEADS, KEY_DIM, implementation="blockwise")
    x = packed_inputs(SEGMENT_IDS, seed=7)
    real = SEGMENT_IDS != 0
    real[0, 4] = False  # a hole inside document 2: it is padding in the packed row and cut from the alone one
    x[0, 4] = np.nan
    packed = np.asarray(layer(x, query_mask=real, value_mask=real, segment_ids=SEGMENT_IDS))
    assert np.all(packed[~real] == 0.0)
    for (row, document), (start, end) in documents(SEGMENT_IDS).items():
        keep = real[row, start:end]
        alone = np.asarray(layer(x[row : row + 1, start:end][:, keep]))
        assert_close(packed[row : row + 1, start:end][:, keep], alone, 2e-5, f"document {document}")


def test_a_subclass_overriding_compute_attention_gets_the_documents_in_its_mask():
    class Hooked(MultiHeadAttention):
        def _compute_attention(self, query, key, value, attention_mask=None, training=None, *args):
            self.seen_mask = attention_mask
            return super()._compute_attention(query, key, value, attention_mask, training, *args)

    keras.utils.set_random_seed(8)
    layer = Hooked(HEADS, KEY_DIM)
    x = packed_inputs(SEGMENT_IDS, seed=9)
    packed = np.asarray(layer(x, x, segment_ids=SEGMENT_IDS))
    same_document = (SEGMENT_IDS[:, :, None] == SEGMENT_IDS[:, None, :]) & (SEGMENT_IDS != 0)[:, :, None]
    np.testing.assert_array_equal(np.asarray(layer.seen_mask)[:, 0], same_document)
    for (row, _), (start, end) in documents(SEGMENT_IDS).items():
        piece = x[row : row + 1, start:end]
        assert_close(packed[row : row + 1, start:end], layer(piece, piece), 2e-5, "hooked")


# A self-attention block and the name of its segment-ids argument.
SELF_ATTENTION_BLOCKS = {
    "encoder_post_norm": (lambda: TransformerEncoder(16, HEADS), "segment_ids"),
    "encoder_pre_norm": (lambda: TransformerEncoder(16, HEADS, norm_first=True), "segment_ids"),
    "decoder_without_cross_attention": (lambda: TransformerDecoder(16, HEADS), "decoder_segment_ids"),
}


@pytest.mark.parametrize("policy, jit_compile", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("block", SELF_ATTENTION_BLOCKS)
def test_a_self_attention_block_of_packed_rows_is_each_document_alone(policy, jit_compile, block):
    keras.utils.set_random_seed(10)
    build, argument = SELF_ATTENTION_BLOCKS[block]
    layer = with_policy(policy, build)
    ids = tf.constant(SEGMENT_IDS)
    assert_packed_equals_alone(
        lambda x: layer(x, **{argument: ids}),
        lambda x: layer(x),
        [packed_inputs(SEGMENT_IDS, seed=11)],
        self_attention_spans(SEGMENT_IDS),
        layer.trainable_variables,
        policy,
        jit_compile,
    )


# Cached decoding of a packed prompt: row 0 holds A (3 tokens) then B (4 tokens).
PROMPT_IDS = np.array([[1, 1, 1, 2, 2, 2, 2]], "int32")
A, B = slice(0, 3), slice(3, 7)


def _prefilled(layer, prompt, ids, cache):
    """The cache and its segment-id record after prefilling `prompt` (ids `ids`, or one document without)."""
    record = None if ids is None else np.zeros((1, cache.shape[2]), "int32")
    documents_kwargs = {} if ids is None else dict(query_segment_ids=ids, key_segment_ids=record)
    _, new_cache = layer(prompt, cache=cache, cache_update_index=0, **documents_kwargs)
    if ids is not None:
        record = layer.next_cache_segment_ids(cache, record, ids, 0)
    return new_cache, record


def _decoded(layer, cache, record, tokens, start, document):
    """Outputs of decoding `tokens` one at a time from position `start`, as document `document` (`None`: unpacked)."""
    outputs = []
    for step in range(tokens.shape[1]):
        token = tokens[:, step : step + 1]
        index = start + step
        kwargs = {}
        if document is not None:
            ids = np.full((1, 1), document, "int32")
            kwargs = dict(query_segment_ids=ids, key_segment_ids=record)
            record_after = layer.next_cache_segment_ids(cache, record, ids, index)
        output, cache = layer(token, cache=cache, cache_update_index=index, **kwargs)
        if document is not None:
            record = record_after
        outputs.append(np.asarray(output))
    return np.concatenate(outputs, axis=1)


# (sliding_window, the document decoded, its tokens in the prompt, new tokens): B continues the last document, in a
# full-length cache and in a ring buffer; a token of A after B attends to A only (in a window of 5 A's tokens would
# have left the ring: a packed row's window is over the row's positions).
DECODING_CASES = {
    "continue_B_full_cache": (None, 2, B, 4),
    "continue_B_ring_buffer": (5, 2, B, 4),
    "token_of_A_after_B": (None, 1, A, 1),
}


@pytest.mark.parametrize("case", DECODING_CASES)
def test_decoding_a_packed_prompt_continues_a_document_as_that_document_alone(case):
    sliding_window, document, tokens, new_len = DECODING_CASES[case]
    keras.utils.set_random_seed(17)
    layer = CausalSelfAttention(HEADS, KEY_DIM, sliding_window=sliding_window)
    rng = np.random.default_rng(18)
    prompt = rng.normal(size=(1, 7, FEATURES)).astype("float32")
    continuation = rng.normal(size=(1, new_len, FEATURES)).astype("float32")
    layer(prompt)
    cache, record = _prefilled(layer, prompt, PROMPT_IDS, layer.initial_cache(1, 12))
    packed = _decoded(layer, cache, record, continuation, 7, document=document)
    alone_prompt = prompt[:, tokens]
    alone_cache, _ = _prefilled(layer, alone_prompt, None, layer.initial_cache(1, 8))
    alone = _decoded(layer, alone_cache, None, continuation, alone_prompt.shape[1], document=None)
    assert_close(packed, alone, 2e-5, "decoded in the packed cache against the document's own cache")
    # The reference of the whole document: its prompt and continuation in one causal call without a cache.
    whole = np.asarray(layer(np.concatenate([alone_prompt, continuation], axis=1)))[:, alone_prompt.shape[1] :]
    assert_close(packed, whole, 2e-5, "decoded in the packed cache against one causal call")


def test_a_decoder_decoding_a_packed_prompt_continues_its_last_document_with_its_own_source():
    keras.utils.set_random_seed(22)
    decoder = TransformerDecoder(16, HEADS)
    rng = np.random.default_rng(23)
    prompt = rng.normal(size=(1, 7, FEATURES)).astype("float32")
    continuation = rng.normal(size=(1, 3, FEATURES)).astype("float32")
    source_ids = np.array([[1, 1, 2, 2, 2, 0]], "int32")  # A's source, B's source, padding
    source = rng.normal(size=(1, 6, 6)).astype("float32")
    decoder(prompt, source)
    cache, cross = decoder.initial_self_attention_cache(1, 10), decoder.compute_cross_attention_cache(source)
    record = np.zeros((1, 10), "int32")
    ids, outputs = PROMPT_IDS, []
    for start, tokens in ((0, prompt), *((7 + step, continuation[:, step : step + 1]) for step in range(3))):
        output, new_cache, _ = decoder(
            tokens,
            self_attention_cache=cache,
            self_attention_cache_update_index=start,
            cross_attention_cache=cross,
            encoder_padding_mask=source_ids != 0,
            decoder_segment_ids=ids,
            encoder_segment_ids=source_ids,
            self_attention_cache_segment_ids=record,
        )
        record = decoder.self_attention.next_cache_segment_ids(cache, record, ids, start)
        cache, ids = new_cache, np.full((1, 1), 2, "int32")
        outputs.append(np.asarray(output))
    whole = np.asarray(decoder(np.concatenate([prompt[:, B], continuation], axis=1), source[:, 2:5]))
    assert_close(np.concatenate(outputs[1:], axis=1), whole[:, 4:], 2e-5, "B continued by the decoder")
    assert_close(outputs[0][:, B], whole[:, :4], 2e-5, "B's prompt in the packed prefill")


def test_the_cache_record_holds_each_slot_document():
    layer = CausalSelfAttention(HEADS, KEY_DIM, sliding_window=4)
    layer(np.zeros((1, 7, FEATURES), "float32"))
    full, ring = layer.initial_cache(1, 9), layer.initial_cache(1, 12)
    assert full.shape[2] == 4 and ring.shape[2] == 4  # a window of 4: a ring buffer whatever max_length
    full = MultiHeadAttention(HEADS, KEY_DIM).initial_cache(1, 9)
    record = layer.next_cache_segment_ids(full, np.zeros((1, 9), "int32"), PROMPT_IDS, 0)
    assert np.asarray(record).tolist() == [[1, 1, 1, 2, 2, 2, 2, 0, 0]]
    record = layer.next_cache_segment_ids(ring, np.zeros((1, 4), "int32"), PROMPT_IDS, 0)
    assert np.asarray(record).tolist() == [[2, 2, 2, 2]]  # positions 4, 5, 6, 3 in slots p % 4
    record = layer.next_cache_segment_ids(ring, np.array([[2, 2, 2, 2]], "int32"), np.array([[3]], "int32"), 7)
    assert np.asarray(record).tolist() == [[2, 2, 2, 3]]


def test_bad_segment_ids_are_refused_naming_the_argument_and_the_value():
    layer = MultiHeadAttention(HEADS, KEY_DIM)
    x = np.ones((2, 10, FEATURES), "float32")
    with pytest.raises(ValueError, match=r"`segment_ids` must be integer.*float32"):
        layer(x, x, segment_ids=SEGMENT_IDS.astype("float32"))
    with pytest.raises(ValueError, match=r"`segment_ids` must have one id per token \(10\).*\(2, 9\)"):
        layer(x, x, segment_ids=SEGMENT_IDS[:, :9])
    with pytest.raises(ValueError, match=r"`query_segment_ids` and `key_segment_ids` come together"):
        layer(x, x, query_segment_ids=SEGMENT_IDS)
    cache = layer.initial_cache(2, 12)
    with pytest.raises(ValueError, match=r"not `segment_ids`.*segment_ids.shape=\(2, 10\)"):
        layer(x, cache=cache, cache_update_index=0, segment_ids=SEGMENT_IDS)
    with pytest.raises(ValueError, match=r"`key_segment_ids` must have one id per token \(12\).*\(2, 10\)"):
        layer(x, cache=cache, cache_update_index=0, query_segment_ids=SEGMENT_IDS, key_segment_ids=SEGMENT_IDS)
    encoder = TransformerEncoder(16, HEADS)
    with pytest.raises(ValueError, match=r"`segment_ids` must have rank 2.*\(10,\)"):
        encoder(x, segment_ids=SEGMENT_IDS[0])
    decoder = TransformerDecoder(16, HEADS)
    with pytest.raises(ValueError, match=r"`decoder_segment_ids` must be integer.*float32"):
        decoder(x, decoder_segment_ids=SEGMENT_IDS.astype("float32"))
    with pytest.raises(ValueError, match=r"`encoder_segment_ids`.*cross-attention=False"):
        decoder(x, decoder_segment_ids=SEGMENT_IDS, encoder_segment_ids=SEGMENT_IDS)
    cross = TransformerDecoder(16, HEADS)
    with pytest.raises(ValueError, match=r"pass `encoder_segment_ids` with `decoder_segment_ids`"):
        cross(x, x, decoder_segment_ids=SEGMENT_IDS)


def test_a_family_without_segments_is_refused_by_the_blocks_and_by_its_call():
    encoder = TransformerEncoder(
        16, HEADS, self_attention=LinformerSelfAttention(HEADS, KEY_DIM, max_length=10, projected_length=4)
    )
    x = np.ones((2, 10, FEATURES), "float32")
    encoder(x)
    with pytest.raises(
        ValueError, match=r"LinformerSelfAttention does not support segments.*segment_ids.shape=\(2, 10\)"
    ):
        encoder(x, segment_ids=SEGMENT_IDS)
    # A recurrent state sums over every earlier token: it cannot hold which document each came from.
    recurrent = TransformerDecoder(16, HEADS, self_attention=LinearAttention(HEADS, KEY_DIM, causal=True))
    recurrent(x)
    state = recurrent.initial_self_attention_cache(2, 10)
    with pytest.raises(ValueError, match=r"Packed decoding needs a key/value cache.*LinearAttention"):
        recurrent(x, self_attention_cache=state, decoder_segment_ids=SEGMENT_IDS)
    keras_axes = MultiHeadAttention(HEADS, KEY_DIM, attention_axes=(1, 2))
    grid = np.ones((2, 10, 3, FEATURES), "float32")
    with pytest.raises(ValueError, match=r"`segment_ids` needs \(batch, seq, features\) inputs"):
        keras_axes(grid, grid, segment_ids=SEGMENT_IDS)
