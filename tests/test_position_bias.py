"""Position biases in every attention kernel: values and gradients against float64 references.

Oracle: `reference.attention` given the NumPy bias (`reference.alibi_bias`,
`reference.relative_position_bias`) and the NumPy pattern mask; gradients against
`reference.attention_gradients` given that bias, the T5 table's gradient as the sum of its bias
gradient over the NumPy bucket ids.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import ALiBi
from keras_attn import MultiHeadAttention
from keras_attn import RelativePositionBias
from keras_attn import TransformerDecoder
from keras_attn import TransformerEncoder
from keras_attn.core.position_bias import PositionBias
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.kernels.blockwise import blockwise_attention
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.patterns import Causal
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference
from tests.dispatch_rule import prefer_kernel
from tests.kernel_registry import kernels_taking
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_mixed_precision_close
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import run_layer_test

BATCH, HEADS, DEPTH = 2, 3, 4
FLOAT32_ATOL = 2e-5

# Every kernel of the registry that takes a position bias, with blocks small enough that the test
# lengths span several (`test_every_kernel_taking_a_position_bias_is_here` keeps it complete).
KERNELS = {
    "dense": lambda *args, **kwargs: scaled_dot_product_attention(*args, implementation="dense", **kwargs),
    "chunked": lambda *args, **kwargs: chunked_attention(*args, chunk_size=3, **kwargs),
    "blockwise": lambda *args, **kwargs: blockwise_attention(*args, query_block_size=4, key_block_size=3, **kwargs),
}

POSITION_BIAS_KERNELS = kernels_taking(pattern=Causal(), position_bias=ALiBi(2))
STREAMING_POSITION_BIAS_KERNELS = [name for name in POSITION_BIAS_KERNELS if name != "dense"]

PATTERNS = {
    "causal": (Causal(), ("causal",)),
    "sparse_transformer": (
        Causal() & (SlidingWindow(3) | Strided(3)),
        ("and", ("causal",), ("or", ("window", 3), ("strided", 3))),
    ),
    "window": (SlidingWindow(4), ("window", 4)),
}


def test_every_kernel_taking_a_position_bias_is_here():
    assert sorted(KERNELS) == sorted(POSITION_BIAS_KERNELS)


def _biases():
    """name -> (layer, NumPy bias of (query positions, key positions), table or None)."""
    rng = np.random.default_rng(7)
    layers = {
        "alibi": ALiBi(HEADS),
        # few buckets and a short max_distance: exact, logarithmic and clipped buckets all occur
        "t5_bidirectional": RelativePositionBias(HEADS, num_buckets=8, max_distance=7),
        "t5_causal": RelativePositionBias(HEADS, num_buckets=6, max_distance=9, bidirectional=False),
    }
    for layer in layers.values():
        layer.build()
        if layer.weights:
            layer.table.assign(rng.standard_normal(layer.table.shape))
    return layers


def _numpy_bias(layer, query_positions, key_positions):
    if isinstance(layer, ALiBi):
        return reference.alibi_bias(layer.num_heads, query_positions, key_positions)
    return reference.relative_position_bias(
        layer.table.numpy(), query_positions, key_positions, layer.bidirectional, layer.max_distance
    )


def _table_gradient(layer, bias_gradient, query_positions, key_positions):
    """`(num_buckets, heads)`: the bias gradient `(batch, heads, q, k)` summed over each bucket."""
    relative = np.asarray(key_positions)[None, :] - np.asarray(query_positions)[:, None]
    buckets = reference.t5_relative_position_bucket(
        relative, layer.bidirectional, layer.num_buckets, layer.max_distance
    )
    per_pair = np.asarray(bias_gradient).sum(0)  # (heads, q, k)
    table = np.zeros((layer.num_buckets, layer.num_heads))
    for head in range(layer.num_heads):
        np.add.at(table[:, head], buckets, per_pair[head])
    return table


def _inputs(rng, query_len, key_len):
    query = rng.standard_normal((BATCH, query_len, HEADS, DEPTH)).astype("float32")
    key = rng.standard_normal((BATCH, key_len, HEADS, DEPTH)).astype("float32")
    value = rng.standard_normal((BATCH, key_len, HEADS, DEPTH)).astype("float32")
    padding = (np.arange(key_len)[None, :] < np.array([key_len, key_len - 3])[:, None]).reshape(BATCH, 1, 1, key_len)
    return query, key, value, padding


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("bias_name", ["alibi", "t5_bidirectional", "t5_causal"])
@pytest.mark.parametrize("pattern_name", sorted(PATTERNS))
@pytest.mark.parametrize("query_len, key_len, query_offset", [(13, 13, 0), (5, 14, 9)])
def test_kernels_match_reference_values_and_gradients(
    kernel, bias_name, pattern_name, query_len, key_len, query_offset
):
    layer = _biases()[bias_name]
    pattern, spec = PATTERNS[pattern_name]
    query, key, value, padding = _inputs(np.random.default_rng(query_len), query_len, key_len)
    query_positions, key_positions = np.arange(query_len) + query_offset, np.arange(key_len)
    allowed = reference.pattern_allowed(spec, query_positions, key_positions)
    mask = padding & allowed[None, None]  # (batch, 1, query_len, key_len)
    bias = _numpy_bias(layer, query_positions, key_positions)  # (1, heads, query_len, key_len)
    expected, _ = reference.attention(query, key, value, mask=mask, bias=bias, scale=0.5)

    tensors = [tf.constant(t) for t in (query, key, value)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        output = KERNELS[kernel](
            *tensors, mask=padding, pattern=pattern, query_offset=query_offset, scale=0.5, position_bias=layer
        )
        loss = tf.reduce_sum(output * tf.cos(tf.range(DEPTH, dtype="float32")))
    grads = tape.gradient(loss, tensors + list(layer.trainable_weights))
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)

    output_gradient = np.broadcast_to(np.cos(np.arange(DEPTH)), expected.shape)
    *expected_grads, bias_gradient = reference.attention_gradients(
        query, key, value, output_gradient, mask=mask, bias=bias, scale=0.5
    )
    for got, want in zip(grads[:3], expected_grads):
        np.testing.assert_allclose(got, want, atol=1e-4)
    if layer.trainable_weights:
        want = _table_gradient(layer, bias_gradient, query_positions, key_positions)
        np.testing.assert_allclose(tf.convert_to_tensor(grads[3]), want, atol=1e-4)
        assert np.abs(want).max() > 1e-3  # the check is not vacuous


def test_position_bias_adds_to_an_explicit_bias():
    layer = _biases()["t5_bidirectional"]
    query, key, value, padding = _inputs(np.random.default_rng(0), 9, 9)
    extra = np.random.default_rng(1).standard_normal((1, HEADS, 9, 9)).astype("float32")
    bias = extra + _numpy_bias(layer, np.arange(9), np.arange(9))
    causal_expected, _ = reference.attention(query, key, value, mask=padding, bias=bias, scale=0.5, is_causal=True)
    for kernel in KERNELS.values():
        output = kernel(query, key, value, mask=padding, bias=extra, pattern=Causal(), scale=0.5, position_bias=layer)
        np.testing.assert_allclose(output, causal_expected, atol=FLOAT32_ATOL)
    without_position_bias, _ = reference.attention(
        query, key, value, mask=padding, bias=extra, scale=0.5, is_causal=True
    )
    assert np.abs(causal_expected - without_position_bias).max() > 1e-2  # the position bias counts


def test_auto_never_drops_the_bias_on_a_kernel_without_one(monkeypatch, tmp_path):
    # A strided pattern where "auto" would pick the strided kernel, which takes no position bias.
    prefer_kernel(monkeypatch, tmp_path, "strided")
    pattern, spec = (
        Causal() & (SlidingWindow(32) | Strided(32)),
        ("and", ("causal",), ("or", ("window", 32), ("strided", 32))),
    )
    layer = _biases()["alibi"]
    length = 256
    query, key, value = (t[:1] for t in _inputs(np.random.default_rng(2), length, length)[:3])
    positions = np.arange(length)
    mask = reference.pattern_allowed(spec, positions, positions)[None, None]
    expected, _ = reference.attention(
        query, key, value, mask=mask, bias=_numpy_bias(layer, positions, positions), scale=0.5
    )
    output = scaled_dot_product_attention(query, key, value, pattern=pattern, scale=0.5, position_bias=layer)
    np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL)
    unbiased = scaled_dot_product_attention(query, key, value, pattern=pattern, scale=0.5)
    assert np.abs(np.asarray(unbiased) - expected).max() > 1e-2  # the bias matters here
    with pytest.raises(ValueError, match="position_bias"):
        scaled_dot_product_attention(query, key, value, pattern=pattern, position_bias=layer, implementation="strided")


def test_bad_position_bias_names_the_argument():
    query, key, value, _ = _inputs(np.random.default_rng(0), 4, 4)
    for kernel in KERNELS.values():
        with pytest.raises(ValueError, match="position_bias"):
            kernel(query, key, value, pattern=Causal(), position_bias=ALiBi(HEADS + 1))
        with pytest.raises(TypeError, match="position_bias"):
            kernel(query, key, value, pattern=Causal(), position_bias="alibi")


def test_blockwise_takes_a_tensor_offset_under_xla():
    layer = _biases()["t5_causal"]
    query, key, value, _ = _inputs(np.random.default_rng(3), 2, 11)
    compiled = tf.function(
        lambda offset: blockwise_attention(
            query,
            key,
            value,
            pattern=Causal(),
            query_offset=offset,
            scale=0.5,
            query_block_size=2,
            key_block_size=3,
            position_bias=layer,
        ),
        jit_compile=True,
    )
    for offset in (0, 4, 9):
        positions = np.arange(2) + offset
        mask = reference.pattern_allowed(("causal",), positions, np.arange(11))[None, None]
        bias = _numpy_bias(layer, positions, np.arange(11))
        expected, _ = reference.attention(query, key, value, mask=mask, bias=bias, scale=0.5)
        np.testing.assert_allclose(compiled(tf.constant(offset)), expected, atol=FLOAT32_ATOL)


def test_the_base_class_must_be_subclassed():
    with pytest.raises(NotImplementedError):
        PositionBias(2)(np.arange(3), np.arange(3))


# MultiHeadAttention and the blocks with a position bias.

WIDTH, KEY_DIM = 8, 4


def _without_bias_weights(layer, position_bias):
    """`layer.get_weights()` without the position bias's table: the order the references read."""
    own = {id(weight) for weight in position_bias.weights}
    return [weight.numpy() for weight in layer.weights if id(weight) not in own]


def _sequence(rng, length):
    x = rng.standard_normal((BATCH, length, WIDTH)).astype("float32")
    padding = np.arange(length)[None, :] < np.array([length, length - 3])[:, None]  # (batch, length)
    return x, padding


@pytest.mark.parametrize("bias_name", ["alibi", "t5_bidirectional", "t5_causal"])
def test_multi_head_attention_matches_reference_and_trains_the_table_on_every_path(bias_name):
    position_bias = _biases()[bias_name]
    layer = MultiHeadAttention(HEADS, KEY_DIM, position_bias=position_bias)
    x, padding = _sequence(np.random.default_rng(5), 11)
    positions = np.arange(11)
    layer(x, x)  # builds the weights
    expected, _ = reference.multi_head_attention(
        _without_bias_weights(layer, position_bias),
        x,
        x,
        mask=reference.padding_attention_mask(padding, padding),
        bias=_numpy_bias(position_bias, positions, positions),
        is_causal=True,
    )
    table_grads = {}
    for implementation in POSITION_BIAS_KERNELS:
        layer.implementation = implementation
        with tf.GradientTape() as tape:
            output = layer(x, x, query_mask=padding, value_mask=padding, use_causal_mask=True)
            loss = tf.reduce_sum(output * tf.cos(tf.range(WIDTH, dtype="float32")))
        np.testing.assert_allclose(output, expected, atol=FLOAT32_ATOL, err_msg=implementation)
        table_grads[implementation] = [tf.convert_to_tensor(g) for g in tape.gradient(loss, position_bias.weights)]
    for implementation in STREAMING_POSITION_BIAS_KERNELS:
        for got, want in zip(table_grads[implementation], table_grads["dense"]):
            np.testing.assert_allclose(got, want, atol=1e-5, err_msg=implementation)
    assert len(table_grads["dense"]) == len(position_bias.weights)


@pytest.mark.parametrize("implementation", POSITION_BIAS_KERNELS)
@pytest.mark.parametrize("bias_name", ["alibi", "t5_causal"])
def test_cached_decoding_equals_full_decoding(implementation, bias_name):
    layer = MultiHeadAttention(HEADS, KEY_DIM, position_bias=_biases()[bias_name], implementation=implementation)
    x, _ = _sequence(np.random.default_rng(6), 7)
    full = layer(x, x, use_causal_mask=True)
    cache = np.zeros((BATCH, 2, 7, HEADS, KEY_DIM), "float32")
    prefill, cache = layer(x[:, :3], x[:, :3], use_causal_mask=True, cache=cache, cache_update_index=0)
    steps = [prefill]
    for index in range(3, 7):
        step, cache = layer(
            x[:, index : index + 1],
            x[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        steps.append(step)
    np.testing.assert_allclose(tf.concat(steps, axis=1), full, atol=FLOAT32_ATOL)


def test_cached_decoding_with_a_tensor_index_under_xla():
    layer = MultiHeadAttention(HEADS, KEY_DIM, position_bias=_biases()["t5_causal"])
    x, _ = _sequence(np.random.default_rng(8), 6)
    full = layer(x, x, use_causal_mask=True)
    step = tf.function(
        lambda token, cache, index: layer(token, token, use_causal_mask=True, cache=cache, cache_update_index=index),
        jit_compile=True,
    )
    cache, steps = tf.zeros((BATCH, 2, 6, HEADS, KEY_DIM)), []
    for index in range(6):
        output, cache = step(x[:, index : index + 1], cache, tf.constant(index))
        steps.append(output)
    np.testing.assert_allclose(tf.concat(steps, axis=1), full, atol=FLOAT32_ATOL)


@pytest.mark.parametrize(
    "position_bias, trainable",
    [(ALiBi(2), 8), (RelativePositionBias(2, num_buckets=8, max_distance=10, bidirectional=False), 9)],
    ids=["alibi", "t5"],
)
def test_multi_head_attention_layer_contract(position_bias, trainable):
    x = np.random.default_rng(9).standard_normal((2, 6, WIDTH)).astype("float32")
    layer = run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=KEY_DIM, position_bias=keras.saving.serialize_keras_object(position_bias)),
        (x, x),
        call_kwargs={"use_causal_mask": True},
        expected_num_trainable_weights=trainable,
    )
    assert type(layer.position_bias) is type(position_bias)


@pytest.mark.parametrize("implementation", STREAMING_POSITION_BIAS_KERNELS)
def test_streaming_kernels_with_a_bias_are_mixed_precision_and_xla_safe(implementation):
    x = np.random.default_rng(14).standard_normal((2, 9, WIDTH)).astype("float32")
    config = keras.saving.serialize_keras_object(RelativePositionBias(2, num_buckets=8, max_distance=10))

    def causal_model():
        inputs = keras.Input((9, WIDTH))
        layer = MultiHeadAttention(2, KEY_DIM, implementation=implementation, position_bias=config)
        return keras.Model(inputs, layer(inputs, inputs, use_causal_mask=True))

    assert_mixed_precision_close(causal_model, x)
    assert_jit_matches_eager(causal_model(), x, training=False)


def test_multi_head_attention_refuses_a_bias_for_other_heads_and_other_axes():
    with pytest.raises(ValueError, match="position_bias"):
        MultiHeadAttention(4, KEY_DIM, position_bias=ALiBi(2))
    with pytest.raises(TypeError, match="position_bias"):
        MultiHeadAttention(2, KEY_DIM, position_bias="alibi")
    layer = MultiHeadAttention(2, KEY_DIM, attention_axes=(1, 2), position_bias=ALiBi(2))
    x = np.zeros((1, 3, 3, WIDTH), "float32")
    with pytest.raises(ValueError, match="position_bias"):
        layer(x, x)

    class Hooked(MultiHeadAttention):
        def _compute_attention(self, *args, **kwargs):
            return super()._compute_attention(*args, **kwargs)

    x = np.zeros((1, 3, WIDTH), "float32")
    with pytest.raises(ValueError, match="position_bias"):  # the hook's signature has no bias
        Hooked(2, KEY_DIM, position_bias=ALiBi(2))(x, x)


def test_transformer_encoder_matches_reference():
    position_bias = _biases()["t5_bidirectional"]
    encoder = TransformerEncoder(intermediate_dim=16, num_heads=HEADS, key_dim=KEY_DIM, position_bias=position_bias)
    x, padding = _sequence(np.random.default_rng(10), 9)
    output = encoder(x, padding_mask=padding)
    positions = np.arange(9)
    expected = reference.transformer_encoder(
        _without_bias_weights(encoder, position_bias),
        x,
        mask=reference.padding_attention_mask(padding, padding),
        bias=_numpy_bias(position_bias, positions, positions),
    )
    real = padding[..., None]
    np.testing.assert_allclose(np.where(real, output, 0), np.where(real, expected, 0), atol=1e-4)
    assert encoder.self_attention.position_bias is position_bias


def test_transformer_decoder_cached_decoding_equals_full_decoding():
    decoder = TransformerDecoder(
        intermediate_dim=16, num_heads=HEADS, key_dim=KEY_DIM, position_bias=_biases()["alibi"]
    )
    target, _ = _sequence(np.random.default_rng(11), 5)
    source, _ = _sequence(np.random.default_rng(12), 4)
    full = decoder(target, source)
    cache = decoder.initial_self_attention_cache(BATCH, 5)
    cross = decoder.compute_cross_attention_cache(source)
    steps = []
    for index in range(5):
        step, cache, cross = decoder(
            target[:, index : index + 1],
            source,
            self_attention_cache=cache,
            self_attention_cache_update_index=index,
            cross_attention_cache=cross,
        )
        steps.append(step)
    np.testing.assert_allclose(tf.concat(steps, axis=1), full, atol=1e-5)
    assert decoder.cross_attention.position_bias is None


def test_blocks_round_trip_through_keras_files():
    tokens = keras.Input((None, WIDTH))
    x = TransformerEncoder(
        16, HEADS, key_dim=KEY_DIM, position_bias=RelativePositionBias(HEADS, num_buckets=8, max_distance=10)
    )(tokens)
    x = TransformerDecoder(16, HEADS, key_dim=KEY_DIM, position_bias=ALiBi(HEADS))(x)
    model = keras.Model(tokens, x)
    reloaded = assert_serialization_round_trip(model, _sequence(np.random.default_rng(13), 6)[0])
    tables = [w for w in reloaded.weights if "table" in w.path]
    assert len(tables) == 1 and np.array_equal(tables[0].numpy(), model.layers[1].position_bias.table.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("bias_name", ["alibi", "t5_causal"])
def test_onnx_export_matches_keras_on_the_dense_and_blockwise_kernels(bias_name, tmp_path):
    import onnxruntime
    import tf2onnx

    from export.onnx_conversion import OPSET

    inputs = keras.Input((None, WIDTH))
    position_bias = _biases()[bias_name]
    x = TransformerDecoder(16, HEADS, key_dim=KEY_DIM, position_bias=position_bias)(inputs)  # dense at these lengths
    blockwise = MultiHeadAttention(HEADS, KEY_DIM, implementation="blockwise", position_bias=position_bias)
    model = keras.Model(inputs, blockwise(x, x, use_causal_mask=True))
    signature = [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x")]
    path = str(tmp_path / "model.onnx")
    tf2onnx.convert.from_function(
        tf.function(lambda x: model(x, training=False), input_signature=signature),
        input_signature=signature,
        opset=OPSET,
        output_path=path,
    )
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    for length in (3, 11):  # dynamic length: the bias follows the positions
        x = _sequence(np.random.default_rng(length), length)[0]
        (got,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(got, model(x), atol=1e-5)
