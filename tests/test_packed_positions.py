"""Positions restart per document: a packed row is encoded, embedded, rotated and biased as each document alone.

Oracles: `document_positions` against a NumPy loop over the runs of equal ids; each position
layer on a packed row against the same layer (or the float64 NumPy reference) on each document
alone; ALiBi and T5's relative bias through `scaled_dot_product_attention(..., segment_ids=...)`
on every kernel against the dense kernel on each document alone, the bias table's gradient the
sum of the documents' gradients.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import ALiBi
from keras_attn import PositionEmbedding
from keras_attn import RelativePositionBias
from keras_attn import RotaryEmbedding
from keras_attn import SinusoidalPositionEncoding
from keras_attn import TokenAndPositionEmbedding
from keras_attn import document_positions
from keras_attn.dispatch.attention import scaled_dot_product_attention
from tests import reference

VOCABULARY = 50


def numpy_document_positions(segment_ids):
    """Position of each token in its run of equal ids; 0 on padding (id 0)."""
    positions = np.zeros(segment_ids.shape, np.int64)
    for row, ids in enumerate(segment_ids):
        for t in range(1, len(ids)):
            positions[row, t] = positions[row, t - 1] + 1 if ids[t] == ids[t - 1] else 0
    return np.where(segment_ids != 0, positions, 0)


def random_packing(rng, batch, length, max_documents=5):
    """Int32 segment ids `(batch, length)`: contiguous documents numbered 1.. then padding (0)."""
    rows = []
    for _ in range(batch):
        ids, number = [], 1
        for _ in range(rng.integers(0, max_documents + 1)):
            room = length - len(ids)
            if room == 0:
                break
            ids += [number] * int(rng.integers(1, room + 1))
            number += 1
        rows.append(ids + [0] * (length - len(ids)))
    return np.array(rows, "int32")


def documents(segment_ids):
    """`(row, start, stop)` of every document of the packed rows."""
    spans = []
    for row, ids in enumerate(segment_ids):
        for number in sorted(set(ids.tolist()) - {0}):
            where = np.flatnonzero(ids == number)
            spans.append((row, int(where[0]), int(where[-1]) + 1))
    return spans


# Several documents, padding at the end, a one-token document, a row of a single document, and
# a row of padding only.
SEGMENT_IDS = np.array(
    [
        [1, 1, 1, 1, 2, 2, 3, 4, 4, 4, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0] * 12,
    ],
    "int32",
)


@pytest.mark.parametrize("seed", range(6))
def test_document_positions_match_numpy_on_random_packings(seed):
    rng = np.random.default_rng(seed)
    segment_ids = random_packing(rng, batch=4, length=int(rng.integers(1, 70)))
    np.testing.assert_array_equal(document_positions(segment_ids), numpy_document_positions(segment_ids))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_document_positions_with_a_dynamic_length_in_a_graph(jit_compile):
    run = tf.function(
        document_positions, input_signature=[tf.TensorSpec((None, None), tf.int32)], jit_compile=jit_compile
    )
    rng = np.random.default_rng(3)
    for length in (1, 2, 7, 64, 65, 130):
        segment_ids = random_packing(rng, batch=3, length=length)
        np.testing.assert_array_equal(run(segment_ids), numpy_document_positions(segment_ids))


def _float_inputs(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def assert_each_document_as_alone(packed, alone, segment_ids, atol):
    """`packed (batch, length, ...)` equals `alone(row, start, stop)` on each document's tokens."""
    for row, start, stop in documents(segment_ids):
        np.testing.assert_allclose(packed[row, start:stop], alone(row, start, stop), atol=atol)


@pytest.mark.parametrize("merge_mode", ["add", "concat"])
def test_sinusoidal_encoding_of_a_packed_row_is_each_documents_float64_encoding(merge_mode):
    inputs = _float_inputs((3, 12, 6))
    layer = SinusoidalPositionEncoding(merge_mode=merge_mode, encoding_dim=6)
    packed = keras.ops.convert_to_numpy(layer(inputs, segment_ids=SEGMENT_IDS))

    def alone(row, start, stop):
        encoding = reference.sinusoidal_encoding(stop - start, 6)  # positions 0 .. stop - start - 1
        document = inputs[row, start:stop].astype(np.float64)
        return document + encoding if merge_mode == "add" else np.concatenate([document, encoding], -1)

    assert_each_document_as_alone(packed, alone, SEGMENT_IDS, atol=2e-6)
    padding = np.flatnonzero(SEGMENT_IDS.reshape(-1) == 0)  # encoded at position 0
    for row, t in zip(*np.divmod(padding, 12)):
        np.testing.assert_allclose(packed[row, t], alone(row, t, t + 1)[0], atol=2e-6)


def test_rotary_of_a_packed_row_is_each_documents_float64_rotation():
    inputs = _float_inputs((3, 12, 2, 8))
    packed = keras.ops.convert_to_numpy(RotaryEmbedding(scaling_factor=2.0)(inputs, segment_ids=SEGMENT_IDS))
    assert_each_document_as_alone(
        packed,
        lambda row, start, stop: reference.rotary_embedding(inputs[row : row + 1, start:stop], 0, 10000.0, 2.0)[0],
        SEGMENT_IDS,
        atol=2e-6,
    )


def test_learned_position_embedding_of_a_packed_row_is_each_documents_rows_of_the_table():
    layer = PositionEmbedding(sequence_length=12)
    packed = keras.ops.convert_to_numpy(layer(np.zeros((3, 12, 4), "float32"), segment_ids=SEGMENT_IDS))
    table = layer.position_embeddings.numpy()
    assert_each_document_as_alone(packed, lambda row, start, stop: table[: stop - start], SEGMENT_IDS, atol=0)


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_token_and_position_embedding_of_a_packed_row_equals_each_document_alone(position_encoding, jit_compile):
    token_ids = np.where(SEGMENT_IDS != 0, np.random.default_rng(1).integers(1, VOCABULARY, SEGMENT_IDS.shape), 0)
    layer = TokenAndPositionEmbedding(VOCABULARY, 12, 8, position_encoding=position_encoding, scale_embeddings=True)
    packed = tf.function(lambda ids, segments: layer(ids, segment_ids=segments), jit_compile=jit_compile)(
        token_ids, SEGMENT_IDS
    )
    assert_each_document_as_alone(
        keras.ops.convert_to_numpy(packed),
        lambda row, start, stop: keras.ops.convert_to_numpy(layer(token_ids[row : row + 1, start:stop]))[0],
        SEGMENT_IDS,
        atol=1e-6,
    )
    assert not np.array_equal(  # the row is not encoded as one sequence
        keras.ops.convert_to_numpy(packed)[0, 4:6], keras.ops.convert_to_numpy(layer(token_ids[:1]))[0, 4:6]
    )


# A 300-token row: three documents crossing the 128-query chunks and blocks of the streaming
# kernels' defaults, then padding; a second row holding one document and padding.
BIAS_SEGMENT_IDS = np.array([[1] * 130 + [2] * 95 + [3] * 55 + [0] * 20, [1] * 270 + [0] * 30], "int32")
HEADS, DEPTH = 2, 4


def _position_biases():
    biases = {
        "alibi": ALiBi(HEADS),
        # max_distance shorter than the documents: clipped buckets occur within each of them
        "t5_bidirectional": RelativePositionBias(HEADS, num_buckets=8, max_distance=20),
        "t5_causal": RelativePositionBias(HEADS, num_buckets=6, max_distance=30, bidirectional=False),
    }
    rng = np.random.default_rng(5)
    for layer in biases.values():
        layer.build()
        for weight in layer.weights:
            weight.assign(rng.standard_normal(weight.shape))
    return biases


def _attention_with_gradients(position_bias, query, key, value, jit_compile=False, **kwargs):
    """Output and gradients of (query, key, value, bias parameters) of a fixed projection of the output."""

    def run(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            output = scaled_dot_product_attention(*tensors, position_bias=position_bias, **kwargs)
            loss = tf.reduce_sum(output * tf.cos(tf.range(DEPTH, dtype="float32")))
        variables = list(tensors) + list(position_bias.trainable_weights)
        grads = tape.gradient(loss, variables, unconnected_gradients="zero")
        return output, [tf.convert_to_tensor(grad) for grad in grads]

    run = tf.function(run, jit_compile=True) if jit_compile else run
    output, grads = run(*(tf.constant(t) for t in (query, key, value)))
    return output.numpy(), [grad.numpy() for grad in grads]


@pytest.mark.parametrize("implementation", ["dense", "chunked", "blockwise"])
@pytest.mark.parametrize(
    "bias_name, is_causal, jit_compile",
    [
        ("alibi", False, False),
        ("alibi", True, False),
        ("t5_bidirectional", False, False),
        ("t5_causal", True, False),
        ("t5_bidirectional", False, True),  # XLA: one case per kernel, compiling costs
    ],
)
def test_position_bias_of_a_packed_row_equals_each_document_alone(implementation, bias_name, is_causal, jit_compile):
    position_bias = _position_biases()[bias_name]
    shape = (*BIAS_SEGMENT_IDS.shape, HEADS, DEPTH)
    query, key, value = (_float_inputs(shape, seed) for seed in range(3))
    output, grads = _attention_with_gradients(
        position_bias,
        query,
        key,
        value,
        segment_ids=BIAS_SEGMENT_IDS,
        is_causal=is_causal,
        implementation=implementation,
        jit_compile=jit_compile,
    )
    table_grads = [np.zeros_like(grad) for grad in grads[3:]]
    for row, start, stop in documents(BIAS_SEGMENT_IDS):
        alone, alone_grads = _attention_with_gradients(
            position_bias,
            *(t[row : row + 1, start:stop] for t in (query, key, value)),
            is_causal=is_causal,
            implementation="dense",
        )
        np.testing.assert_allclose(output[row, start:stop], alone[0], atol=2e-5)
        for grad, alone_grad in zip(grads[:3], alone_grads[:3]):
            np.testing.assert_allclose(grad[row, start:stop], alone_grad[0], atol=2e-5)
        table_grads = [total + grad for total, grad in zip(table_grads, alone_grads[3:])]
    padding = BIAS_SEGMENT_IDS == 0
    for tensor in [output, *grads[:3]]:  # padding neither attends nor is attended
        np.testing.assert_array_equal(tensor[padding], 0)
    for grad, total in zip(grads[3:], table_grads):  # the documents' gradients sum
        np.testing.assert_allclose(grad, total, rtol=1e-4, atol=1e-4)
        assert np.abs(total).max() > 1e-2


def packed_embedding_model():
    """Token ids and segment ids in, rotated embeddings out: every position layer fed `segment_ids`."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    segments = keras.Input((None,), dtype="int32", name="segment_ids")
    hidden = TokenAndPositionEmbedding(VOCABULARY, 16, 8, mask_zero=False)(ids, segment_ids=segments)
    hidden = SinusoidalPositionEncoding(merge_mode="concat", encoding_dim=8)(hidden, segment_ids=segments)
    heads = keras.layers.Reshape((-1, 2, 8))(hidden)
    rotated = RotaryEmbedding()(heads, segment_ids=segments)
    return keras.Model([ids, segments], keras.layers.Dense(3)(keras.layers.Reshape((-1, 16))(rotated)))


def test_a_model_taking_segment_ids_exports_to_saved_model_and_onnx(tmp_path):
    import onnxruntime

    from export.onnx_conversion import convert

    model = packed_embedding_model()
    segment_ids = random_packing(np.random.default_rng(2), batch=3, length=13)
    token_ids = np.where(
        segment_ids != 0, np.random.default_rng(4).integers(1, VOCABULARY, segment_ids.shape), 0
    ).astype("int32")
    expected = keras.ops.convert_to_numpy(model([token_ids, segment_ids]))
    assert_each_document_as_alone(
        expected,
        lambda row, start, stop: keras.ops.convert_to_numpy(
            model([token_ids[row : row + 1, start:stop], segment_ids[row : row + 1, start:stop]])
        )[0],
        segment_ids,
        atol=1e-5,
    )

    model.export(str(tmp_path / "saved_model"), format="tf_saved_model", verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "saved_model"))
    np.testing.assert_allclose(reloaded.serve([token_ids, segment_ids]), expected, atol=1e-5)

    spec = tf.TensorSpec((None, None), tf.int32)
    convert(
        tf.function(lambda ids, segments: model([ids, segments]), input_signature=[spec, spec]), tmp_path / "m.onnx"
    )
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    names = [tensor.name for tensor in session.get_inputs()]
    np.testing.assert_allclose(session.run(None, dict(zip(names, (token_ids, segment_ids))))[0], expected, atol=1e-4)


POSITION_LAYERS = {
    "sinusoidal": (lambda: SinusoidalPositionEncoding(), (2, 5, 4)),
    "learned": (lambda: PositionEmbedding(sequence_length=8), (2, 5, 4)),
    "rotary": (lambda: RotaryEmbedding(), (2, 5, 2, 4)),
}


@pytest.mark.parametrize("layer_name", sorted(POSITION_LAYERS))
def test_given_positions_equal_the_contiguous_range_they_spell(layer_name):
    factory, shape = POSITION_LAYERS[layer_name]
    layer, inputs = factory(), _float_inputs(shape)
    positions = np.tile(np.arange(3, 8, dtype="int32"), (2, 1))
    np.testing.assert_allclose(layer(inputs, positions=positions), layer(inputs, start_index=3), atol=1e-6)
    shuffled = positions[:, ::-1].copy()  # each token at its own position
    got = keras.ops.convert_to_numpy(layer(inputs, positions=shuffled))
    for t, position in enumerate(shuffled[0]):
        alone = layer(inputs[:, t : t + 1], start_index=int(position))
        np.testing.assert_allclose(got[:, t], keras.ops.convert_to_numpy(alone)[:, 0], atol=1e-6)


@pytest.mark.parametrize("layer_name", sorted(POSITION_LAYERS))
def test_bad_position_arguments_name_the_argument_and_value(layer_name):
    factory, shape = POSITION_LAYERS[layer_name]
    layer, inputs = factory(), _float_inputs(shape)
    positions = np.zeros((2, 5), "int32")
    with pytest.raises(ValueError, match=r"either `positions`.*not both.*segment_ids.shape=\(2, 5\)"):
        layer(inputs, positions=positions, segment_ids=positions)
    with pytest.raises(ValueError, match=r"`start_index` must stay 0.*start_index=2"):
        layer(inputs, start_index=2, segment_ids=positions)
    with pytest.raises(ValueError, match=r"`start_index` must stay 0.*start_index=<tf.Tensor"):
        layer(inputs, start_index=tf.constant(0), positions=positions)
    with pytest.raises(ValueError, match=r"`positions` must be a tensor of dtype int.*positions.dtype=float32"):
        layer(inputs, positions=positions.astype("float32"))
    with pytest.raises(ValueError, match=r"`segment_ids` must have one id per token \(5\).*segment_ids.shape=\(2, 4\)"):
        layer(inputs, segment_ids=positions[:, :4])
    with pytest.raises(
        ValueError, match=r"`positions` must be a tensor of dtype int and rank 2.*positions.shape=\(5,\)"
    ):
        layer(inputs, positions=positions[0])
    with pytest.raises(ValueError, match=r"`positions` must be .*Received: positions holding -3"):
        layer(inputs, positions=positions - 3)
    with pytest.raises(ValueError, match=r"`start_index` must be an int in \[0, 2147483647\].*start_index=-1"):
        layer(inputs, start_index=-1)


def test_learned_positions_past_the_table_are_refused_never_clamped():
    layer = PositionEmbedding(sequence_length=8)
    inputs = np.zeros((1, 3, 4), "float32")
    with pytest.raises(ValueError, match=r"`positions` must hold whole-number ids in \[0, sequence_length=8\).*8"):
        layer(inputs, positions=np.array([[6, 7, 8]], "int32"))
    in_graph = tf.function(lambda x, positions: layer(x, positions=positions))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sequence_length=8"):
        in_graph(inputs, np.array([[6, 7, 8]], "int32"))
    with pytest.raises(ValueError, match=r"9 exceeds sequence_length=8"):  # a row longer than the table
        layer(np.zeros((1, 9, 4), "float32"), segment_ids=np.ones((1, 9), "int32"))
    dynamic = tf.function(
        lambda x, ids: layer(x, segment_ids=ids),
        input_signature=[tf.TensorSpec((None, None, 4), tf.float32), tf.TensorSpec((None, None), tf.int32)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"exceeds sequence_length=8"):
        dynamic(np.zeros((1, 9, 4), "float32"), np.ones((1, 9), "int32"))


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_packed_rows_equal_each_document_alone_under_mixed_precision_and_xla(policy, jit_compile):
    keras.config.set_dtype_policy(policy)  # the conftest fixture restores float32
    model = packed_embedding_model()
    segment_ids = random_packing(np.random.default_rng(6), batch=3, length=13)
    token_ids = np.where(segment_ids != 0, np.random.default_rng(8).integers(1, VOCABULARY, segment_ids.shape), 0)
    packed = tf.function(model, jit_compile=jit_compile)([token_ids, segment_ids])
    assert packed.dtype == model.compute_dtype
    tolerance = {"float32": 1e-5, "mixed_float16": 1e-2, "mixed_bfloat16": 6e-2}[policy]
    assert_each_document_as_alone(
        keras.ops.convert_to_numpy(packed).astype("float32"),
        lambda row, start, stop: keras.ops.convert_to_numpy(
            model([token_ids[row : row + 1, start:stop], segment_ids[row : row + 1, start:stop]])
        )[0].astype("float32"),
        segment_ids,
        atol=tolerance,
    )


def test_a_model_taking_segment_ids_compiles_with_xla_for_any_length():
    model = packed_embedding_model()
    spec = tf.TensorSpec((None, None), tf.int32)
    compiled = tf.function(lambda ids, segments: model([ids, segments]), input_signature=[spec, spec], jit_compile=True)
    rng = np.random.default_rng(9)
    for length in (3, 13, 16):
        segment_ids = random_packing(rng, batch=2, length=length)
        token_ids = np.where(segment_ids != 0, rng.integers(1, VOCABULARY, segment_ids.shape), 0).astype("int32")
        np.testing.assert_allclose(compiled(token_ids, segment_ids), model([token_ids, segment_ids]), atol=1e-5)
