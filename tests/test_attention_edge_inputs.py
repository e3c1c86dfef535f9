"""scaled_dot_product_attention at its edges: bad inputs get a ValueError naming the argument and
the value; NaN/inf in padded keys and values never reach a real output, on every kernel."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attn.attention_families import FAMILIES
from keras_attn.attention_families import build
from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.patterns import Causal
from tests import reference
from tests.kernel_registry import kernels_taking

# Every kernel that takes a bias under a causal pattern.
BIASED_CAUSAL_KERNELS = kernels_taking(with_bias=True, pattern=Causal())

_Q = np.zeros((1, 3, 2, 4), np.float32)

# (what, keyword arguments, text the message must hold: the argument and the value received)
BAD_INPUTS = [
    ("int query", {"query": _Q.astype(np.int32)}, "`query` must be a floating tensor. Received: query.dtype=int32"),
    ("int key", {"key": _Q.astype(np.int64)}, "key.dtype=int64"),
    ("int value", {"value": _Q.astype(np.int32)}, "value.dtype=int32"),
    ("bool value", {"value": _Q.astype(bool)}, "value.dtype=bool"),
    ("zero scale", {"scale": 0.0}, "`scale` must be a positive finite number or None, at most 3.40282346"),
    ("zero scale value", {"scale": 0.0}, "Received: scale=0.0"),
    ("scale past float32", {"scale": 3.5e38}, "Received: scale=3.5e+38"),
    ("negative scale", {"scale": -0.5}, "scale=-0.5"),
    ("nan scale", {"scale": float("nan")}, "scale=nan"),
    ("inf scale", {"scale": float("inf")}, "scale=inf"),
    ("bool scale", {"scale": True}, "scale=True"),
    ("string scale", {"scale": "0.5"}, "scale='0.5'"),
    ("rank-3 query", {"query": _Q[0]}, "query.shape=(3, 2, 4)"),
    ("rank-2 mask", {"mask": np.ones((3, 3), bool)}, "mask.shape=(3, 3)"),
    ("mask of the wrong length", {"mask": np.ones((1, 1, 3, 5), bool)}, "mask.shape=(1, 1, 3, 5)"),
    ("bias of the wrong length", {"bias": np.zeros((1, 1, 4, 3), np.float32)}, "bias.shape=(1, 1, 4, 3)"),
    ("zero window", {"sliding_window": 0}, "sliding_window=0"),
    ("negative offset", {"query_offset": -1}, "query_offset=-1"),
    ("dropout 1", {"dropout_rate": 1.0}, "dropout_rate=1.0"),
    ("unknown implementation", {"implementation": "flash"}, "implementation='flash'"),
]


@pytest.mark.parametrize("what, overrides, message", BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_names_argument_and_value(what, overrides, message):
    arguments = {"query": _Q, "key": _Q, "value": _Q, **overrides}
    with pytest.raises(ValueError) as error:
        scaled_dot_product_attention(**arguments)
    assert message in str(error.value)


def test_accepted_scales_match_the_reference():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 5, 2, 4)).astype(np.float32) for _ in range(3))
    for scale in (0.1, 2, np.float32(0.7), tf.constant(0.3)):
        expected, _ = reference.attention(q, k, v, scale=float(scale))
        np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, scale=scale), expected, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=2, max_size=2),
    poison=st.sampled_from([np.nan, np.inf, -np.inf, 1e30]),
    implementation=st.sampled_from(BIASED_CAUSAL_KERNELS),
    is_causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_padded_keys_and_values_never_reach_real_outputs(lengths, poison, implementation, is_causal, seed):
    """Whatever a padded key/value holds, the real queries' outputs are finite and equal the float64
    reference computed with zeros there (padded queries' outputs are not constrained)."""
    rng = np.random.default_rng(seed)
    batch, length, heads, depth = 2, 9, 2, 4
    q, k, v = (rng.normal(size=(batch, length, heads, depth)).astype(np.float32) for _ in range(3))
    real = np.arange(length)[None, :] < np.array(lengths)[:, None]  # (batch, length)
    mask = real[:, None, None, :] & real[:, None, :, None]  # (batch, 1, query, key)
    poisoned_k, poisoned_v = k.copy(), v.copy()
    poisoned_k[~real] = poison
    poisoned_v[~real] = poison
    if implementation == "chunked" and not is_causal:
        is_causal = True  # the chunked kernel is the banded one
    output = scaled_dot_product_attention(
        q, poisoned_k, poisoned_v, mask=mask, is_causal=is_causal, implementation=implementation
    )
    expected, _ = reference.attention(
        q, np.where(real[..., None, None], k, 0), np.where(real[..., None, None], v, 0), mask=mask, is_causal=is_causal
    )
    output = np.asarray(output)
    assert np.all(np.isfinite(output[real]))
    np.testing.assert_allclose(output[real], expected[real], atol=1e-5)


def test_padded_nan_cannot_reach_real_outputs_under_xla():
    q = np.ones((1, 4, 1, 2), np.float32)
    v = np.arange(8, dtype=np.float32).reshape(1, 4, 1, 2)
    poisoned = v.copy()
    poisoned[0, 3] = np.nan
    mask = np.array([True, True, True, False])[None, None, None, :]
    compiled = tf.function(lambda k, v: scaled_dot_product_attention(q, k, v, mask=mask), jit_compile=True)
    output = compiled(tf.constant(poisoned), tf.constant(poisoned)).numpy()
    expected, _ = reference.attention(q, v * [[[1]], [[1]], [[1]], [[0]]], v * [[[1]], [[1]], [[1]], [[0]]], mask=mask)
    np.testing.assert_allclose(output, expected, atol=1e-5)


@pytest.mark.parametrize(
    "mask_shape",
    [(2,), (2, 5, 1), (2, 5, 3), (1, 2, 5), (2, 4), (3, 5)],
)
def test_masked_global_pooling_rejects_a_mask_not_shaped_batch_seq(mask_shape):
    from keras_attn.blocks.masked_global_pooling import MaskedGlobalPooling

    inputs = np.ones((2, 5, 3), np.float32)
    with pytest.raises(ValueError, match=r"`mask` must have shape \(batch, seq\)=\(2, 5\)\. Received: mask\.shape="):
        MaskedGlobalPooling()(inputs, mask=np.ones(mask_shape, bool))


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_masked_global_pooling_broadcast_free_mask_matches_numpy(mode):
    from keras_attn.blocks.masked_global_pooling import MaskedGlobalPooling

    rng = np.random.default_rng(1)
    inputs = rng.normal(size=(2, 5, 3)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    expected = np.stack([getattr(np, mode)(inputs[b][mask[b]].astype(np.float64), axis=0) for b in range(2)])
    np.testing.assert_allclose(MaskedGlobalPooling(mode)(inputs, mask=mask), expected, atol=1e-6)


def _cached_layer():
    from keras_attn.layers.multi_head_attention import MultiHeadAttention

    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.ones((1, 2, 8), np.float32)
    cache = np.zeros((1, 2, 6, 2, 4), np.float32)
    return layer, x, cache


@pytest.mark.parametrize("index", [5, 6, 100, -1])
def test_cache_update_index_past_the_end_names_the_index(index):
    layer, x, cache = _cached_layer()  # 2 new tokens fit at 0..4 in a cache of 6
    with pytest.raises(ValueError, match=rf"`cache_update_index` must be in \[0, 4\].*cache_update_index={index}"):
        layer(x, x, cache=cache, cache_update_index=index)


@pytest.mark.parametrize("index", [5, -1])
def test_cache_overflow_fails_at_run_time_in_tf_function(index):
    layer, x, cache = _cached_layer()
    layer(x, x, cache=cache, cache_update_index=0)  # builds the layer
    step = tf.function(lambda i: layer(x, x, cache=cache, cache_update_index=i))
    with pytest.raises(tf.errors.InvalidArgumentError, match="cache_update_index"):
        step(tf.constant(index))
    _, written = step(tf.constant(4))  # the last slots that fit are written, unclamped
    np.testing.assert_array_equal(np.asarray(written)[:, :, :4], 0.0)
    assert np.all(np.asarray(written)[:, :, 4:] != 0.0)


def test_decoder_cache_without_an_update_index_is_refused():
    from keras_attn.blocks.transformer_decoder import TransformerDecoder

    decoder = TransformerDecoder(intermediate_dim=8, num_heads=2)
    x = np.ones((1, 1, 8), np.float32)
    decoder(x)
    with pytest.raises(ValueError, match="Received: self_attention_cache_update_index=None"):
        decoder(x, self_attention_cache=np.zeros((1, 2, 4, 2, 4), np.float32))


def _minus_inf_bias_case(rng, length, inf_fraction, masked_row, padded=True):
    """Inputs `(batch 2, length, heads 2, depth 4)`, a full bias with `-inf` over a random part of
    its entries, over the whole of query row `masked_row` of sequence 0, and over all of the keys
    of sequence 1's last query; when `padded`, a padding mask hiding sequence 1's last key."""
    batch, heads, depth = 2, 2, 4
    q, k, v = (rng.normal(size=(batch, length, heads, depth)).astype(np.float32) for _ in range(3))
    bias = rng.normal(size=(batch, heads, length, length)).astype(np.float32)
    bias[rng.random(bias.shape) < inf_fraction] = -np.inf
    bias[0, :, masked_row] = -np.inf
    bias[1, 0, length - 1] = -np.inf
    if not padded:
        return q, k, v, bias, None
    mask = np.ones((batch, 1, 1, length), bool)
    mask[1, ..., length - 1] = False
    return q, k, v, bias, mask


def _attend_with_gradients(implementation, mode, q, k, v, bias, mask, is_causal):
    def attend(q, k, v, bias, output_gradient):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, bias])
            output = scaled_dot_product_attention(
                q, k, v, mask=mask, bias=bias, is_causal=is_causal, implementation=implementation
            )
            loss = tf.reduce_sum(output * output_gradient)
        return output, tape.gradient(loss, [q, k, v, bias])

    if mode != "eager":
        attend = tf.function(attend, jit_compile=mode == "xla")
    output_gradient = np.cos(np.arange(q.size, dtype=np.float32)).reshape(q.shape)
    output, grads = attend(*(tf.constant(t) for t in (q, k, v, bias, output_gradient)))
    return np.asarray(output), [np.asarray(g) for g in grads], output_gradient


def _check_against_reference(output, grads, output_gradient, q, k, v, bias, mask, is_causal):
    expected, weights = reference.attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal)
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output, expected, atol=1e-5)
    rows_without_keys = ~weights.any(-1)  # (batch, heads, query_len)
    assert np.all(output.transpose(0, 2, 1, 3)[rows_without_keys] == 0.0)
    for got, want in zip(grads, reference.attention_gradients(q, k, v, output_gradient, mask, bias, is_causal)):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("implementation", BIASED_CAUSAL_KERNELS)
def test_minus_inf_bias_acts_as_a_mask_on_every_kernel(implementation, mode):
    """`-inf` bias entries (scattered, a whole row, a row with padding) give the float64 reference's
    outputs and gradients (zero bias gradient there), finite everywhere, zero rows without keys."""
    # sequence 0's last row: every key `-inf`, none masked otherwise (the causal row sees them all)
    q, k, v, bias, mask = _minus_inf_bias_case(np.random.default_rng(7), 6, 0.3, masked_row=5)
    is_causal = implementation == "chunked"  # the chunked kernel is the banded one
    output, grads, output_gradient = _attend_with_gradients(implementation, mode, q, k, v, bias, mask, is_causal)
    _check_against_reference(output, grads, output_gradient, q, k, v, bias, mask, is_causal)
    assert np.all(grads[3][np.isneginf(bias)] == 0.0)


@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 9),
    inf_fraction=st.sampled_from([0.0, 0.3, 0.8, 1.0]),
    implementation=st.sampled_from(BIASED_CAUSAL_KERNELS),
    is_causal=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_minus_inf_bias_matches_the_reference_property(length, inf_fraction, implementation, is_causal, padded, seed):
    rng = np.random.default_rng(seed)
    q, k, v, bias, mask = _minus_inf_bias_case(rng, length, inf_fraction, rng.integers(length), padded)
    is_causal = is_causal or implementation == "chunked"
    output, grads, output_gradient = _attend_with_gradients(implementation, "eager", q, k, v, bias, mask, is_causal)
    _check_against_reference(output, grads, output_gradient, q, k, v, bias, mask, is_causal)


@pytest.mark.parametrize("masking_bias", [-np.inf, -1e9, np.finfo(np.float32).min])
def test_a_masking_bias_gives_the_weights_of_the_boolean_mask(masking_bias):
    """The `-inf`, lowest-float and `-1e9` idioms mask exactly like `mask=False`: weights exactly 0
    there, a row masked throughout gets zero weights and a zero output (float16 too)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 4, 1, 2)).astype(np.float32) for _ in range(3))
    allowed = np.array([[True, False, True, False], [False] * 4, [True] * 4, [False, False, False, True]])
    bias = np.where(allowed, 0.0, masking_bias).astype(np.float32)[None, None]
    expected_output, expected_weights = reference.attention(q, k, v, mask=allowed[None, None])
    for dtype in ("float32", "float16"):
        cast = [tf.constant(t, dtype) for t in (q, k, v)]
        output, weights = scaled_dot_product_attention(*cast, bias=bias, return_weights=True)
        weights = np.asarray(weights, np.float64)
        assert np.all(weights[0, 0][~allowed] == 0.0) and np.all(np.asarray(output)[0, 1] == 0.0)
        np.testing.assert_allclose(weights, expected_weights, atol=1e-3 if dtype == "float16" else 1e-6)
        np.testing.assert_allclose(
            np.asarray(output, np.float64), expected_output, atol=1e-2 if dtype == "float16" else 1e-5
        )


def test_minus_inf_attention_bias_through_multi_head_attention():
    """`MultiHeadAttention(attention_bias=...)` with a row of `-inf`: finite, the layer with the
    same weights under the boolean mask."""
    from keras_attn.layers.multi_head_attention import MultiHeadAttention

    x = np.random.default_rng(5).normal(size=(2, 5, 8)).astype(np.float32)
    allowed = np.tril(np.ones((5, 5), bool))
    allowed[3] = False
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    masked = layer(x, x, attention_mask=np.broadcast_to(allowed, (2, 5, 5)))
    biased = layer(x, x, attention_bias=np.where(allowed, 0.0, -np.inf).astype(np.float32)[None, None])
    assert np.all(np.isfinite(biased))
    np.testing.assert_allclose(biased, masked, atol=1e-6)


def _layers():
    """The public layers (and the models' id layers) by name, small enough to call at once."""
    import keras_attn as ka
    from models.ngram_bag import NgramBag
    from models.sparse_linear import SparseLinear

    return {
        "SelfAttention": lambda: ka.SelfAttention(num_heads=2, key_dim=4),
        "CrossAttention": lambda: ka.CrossAttention(num_heads=2, key_dim=4),
        "MultiHeadAttention": lambda: ka.MultiHeadAttention(num_heads=2, key_dim=4),
        "TransformerEncoder": lambda: ka.TransformerEncoder(intermediate_dim=8, num_heads=2),
        "TransformerDecoder": lambda: ka.TransformerDecoder(intermediate_dim=8, num_heads=2),
        "LinearAttention": lambda: ka.LinearAttention(num_heads=2, key_dim=4),
        "LinformerSelfAttention": lambda: ka.LinformerSelfAttention(
            num_heads=2, key_dim=4, max_length=8, projected_length=2
        ),
        "LSHSelfAttention": lambda: ka.LSHSelfAttention(num_heads=2, key_dim=4, num_buckets=2, chunk_size=2),
        "RotaryEmbedding": ka.RotaryEmbedding,
        "SinusoidalPositionEncoding": ka.SinusoidalPositionEncoding,
        "PositionEmbedding": lambda: ka.PositionEmbedding(8),
        "TokenAndPositionEmbedding": lambda: ka.TokenAndPositionEmbedding(10, 8, 4),
        "NgramBag": lambda: NgramBag(10, 8),
        "SparseLinear": lambda: SparseLinear(10),
    }


_X = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32)
_IDS = np.array([[3, 4, 0, 0], [1, 2, 3, 9]])
_ONES = np.ones((2, 4), bool)

# (layer, positional inputs, keyword arguments, text the ValueError must hold: argument and value)
BAD_LAYER_CALLS = [
    (
        "TokenAndPositionEmbedding",
        (_IDS - 1,),
        {},
        "`token_ids` must hold whole-number ids in [0, vocabulary_size=10). Received: token_ids holding -1",
    ),
    ("TokenAndPositionEmbedding", (_IDS + 1,), {}, "token_ids holding 10"),
    ("TokenAndPositionEmbedding", (_IDS + 0.5,), {}, "token_ids holding 0.5"),
    ("TokenAndPositionEmbedding", (_IDS,), {"start_index": 5}, "5 + 4 = 9 exceeds sequence_length=8"),
    ("TokenAndPositionEmbedding", (_IDS,), {"start_index": -1}, "start_index=-1"),
    (
        "NgramBag",
        (_IDS + 1,),
        {},
        "`token_ids` must hold whole-number ids in [0, vocabulary_size=10). Received: token_ids holding 10",
    ),
    ("NgramBag", (_IDS - 4,), {}, "token_ids holding -4, -3, -2, -1"),
    (
        "SparseLinear",
        ((np.array([[1, 10]]), np.ones((1, 2), np.float32)),),
        {},
        "`features` must hold whole-number ids in [0, num_features=10). Received: features holding 10",
    ),
    ("SparseLinear", ((np.array([[-1, 2]]), np.ones((1, 2), np.float32)),), {}, "features holding -1"),
    (
        "PositionEmbedding",
        (_X,),
        {"start_index": 1.5},
        "`start_index` must be an int in [0, 2147483647] or an integer tensor. Received: start_index=1.5",
    ),
    ("PositionEmbedding", (_X,), {"start_index": -1}, "start_index=-1"),
    (
        "PositionEmbedding",
        (_X,),
        {"start_index": 5},
        "start_index + input length = 5 + 4 = 9 exceeds sequence_length=8",
    ),
    ("RotaryEmbedding", (_X.reshape(2, 4, 2, 4),), {"start_index": -1}, "start_index=-1"),
    ("RotaryEmbedding", (_X.reshape(2, 4, 2, 4),), {"start_index": 1.5}, "start_index=1.5"),
    ("SinusoidalPositionEncoding", (_X,), {"start_index": -3}, "start_index=-3"),
    ("SinusoidalPositionEncoding", (_X,), {"start_index": 0.5}, "start_index=0.5"),
    (
        "LinearAttention",
        (_X,),
        {"query_mask": _ONES[:, :3]},
        "`query_mask` must have shape (batch, seq)=(2, 4) of the inputs. Received: query_mask.shape=(2, 3)",
    ),
    ("LinearAttention", (_X,), {"value_mask": np.ones((2, 4, 4), bool)}, "value_mask.shape=(2, 4, 4)"),
    (
        "LinearAttention",
        (_X, _X[:, :3]),
        {},
        "LinearAttention does not support cross (its capabilities declare cross=False).",
    ),
    ("LinformerSelfAttention", (_X,), {"key_mask": _ONES[:, :3]}, "key_mask.shape=(2, 3)"),
    ("LinformerSelfAttention", (np.ones((2, 9, 8), np.float32),), {}, "`query` is longer than `max_length=8`"),
    ("LinformerSelfAttention", (_X,), {"use_causal_mask": True}, "LinformerSelfAttention does not support causal"),
    ("LSHSelfAttention", (_X,), {"query_mask": np.ones((3, 4), bool)}, "query_mask.shape=(3, 4)"),
    (
        "LSHSelfAttention",
        (_X,),
        {"attention_mask": np.ones((2, 4, 4), bool)},
        "Received: attention_mask.shape=(2, 4, 4)",
    ),
    (
        "TransformerEncoder",
        (_X,),
        {"padding_mask": _ONES[:, :3]},
        "`padding_mask` must have shape (batch, seq)=(2, 4) of the inputs. Received: padding_mask.shape=(2, 3)",
    ),
    ("TransformerEncoder", (_X,), {"padding_mask": np.ones((3, 4), bool)}, "padding_mask.shape=(3, 4)"),
    ("TransformerEncoder", (_X,), {"padding_mask": np.ones((2, 4, 1), bool)}, "padding_mask.shape=(2, 4, 1)"),
    ("TransformerDecoder", (_X, _X[:, :3]), {"encoder_padding_mask": _ONES}, "encoder_padding_mask.shape=(2, 4)"),
    ("TransformerDecoder", (_X,), {"decoder_padding_mask": _ONES[:, :2]}, "decoder_padding_mask.shape=(2, 2)"),
    ("SelfAttention", (_X,), {"query_mask": _ONES[:, :3]}, "query_mask.shape=(2, 3)"),
    ("SelfAttention", (_X, _X[:, :3]), {}, "SelfAttention does not support cross"),
    ("CrossAttention", (_X, _X[:1]), {}, "`query`, `key` and `value` must have the same batch size"),
    ("CrossAttention", (_X, _X[:, :3]), {"value_mask": _ONES}, "value_mask.shape=(2, 4)"),
    ("MultiHeadAttention", (_X, _X[:1]), {}, "key.shape=(1, 4, 8)"),  # refused before the projections
    (
        "MultiHeadAttention",
        (_X[:, :1], _X[:, :1]),
        {"cache": np.zeros((2, 2, 6, 2, 4), np.float32), "cache_update_index": 1.5},
        "`cache_update_index` must be an int in [0, 2147483647] or an integer tensor. Received: cache_update_index=1.5",
    ),
    ("MultiHeadAttention", (_X, _X), {"attention_bias": np.zeros((1, 1, 4, 4), bool)}, "bias.dtype=bool"),
]


@pytest.mark.parametrize(
    "name, inputs, keywords, message", BAD_LAYER_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_LAYER_CALLS)]
)
def test_bad_layer_call_names_argument_and_value(name, inputs, keywords, message):
    with pytest.raises(ValueError) as error:
        _layers()[name]()(*inputs, **keywords)
    assert message in str(error.value)


@pytest.mark.parametrize("name", ["TokenAndPositionEmbedding", "NgramBag"])
def test_out_of_range_token_ids_fail_at_run_time_in_tf_function(name):
    layer = _layers()[name]()
    layer(_IDS)  # builds it
    call = tf.function(lambda ids: layer(ids))
    for bad in (_IDS - 1, _IDS + 1):
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"`token_ids` must hold whole-number ids in \[0, "
            r"vocabulary_size=10\)",
        ):
            call(tf.constant(bad))
    np.testing.assert_array_equal(np.asarray(call(tf.constant(_IDS))[0]), np.asarray(layer(_IDS)[0]))


def test_under_xla_an_out_of_range_token_id_gives_nan_not_a_clamped_row():
    """XLA drops an assertion (it would read the last row for -1 and 10): the output is NaN instead."""
    import keras_attn as ka

    layer = ka.TokenAndPositionEmbedding(10, 8, 4, position_encoding="sinusoidal")
    layer(_IDS)
    compiled = tf.function(lambda ids: layer(ids), jit_compile=True)
    for bad in (-1, 10):
        assert np.all(np.isnan(np.asarray(compiled(tf.constant([[bad, 1]])))))
    np.testing.assert_allclose(np.asarray(compiled(tf.constant(_IDS))), np.asarray(layer(_IDS)), atol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        {"query_offset": 1.5, "is_causal": True},
        {"is_causal": "no"},
        {"bias": "zero"},
        {"key": _Q[:, :2], "value": _Q[:, :2], "query": np.zeros((2, 3, 2, 4), np.float32)},
    ],
    ids=["float offset", "string is_causal", "string bias", "batch mismatch"],
)
def test_more_bad_core_op_inputs(call):
    arguments = {"query": _Q, "key": _Q, "value": _Q, **call}
    name = next(iter(call)) if "query" not in call else "batch size"
    with pytest.raises(ValueError, match=name):
        scaled_dot_product_attention(**arguments)


@pytest.mark.parametrize("name", ["LinformerSelfAttention", "LSHSelfAttention", "LinearAttention"])
def test_nan_in_padded_inputs_never_reaches_real_outputs_of_projected_layers(name):
    """Padded positions are projected from zeros: the real outputs with NaN/inf padding equal
    those with zero padding (they were NaN for Linformer and LSH)."""
    real = np.arange(4)[None] < np.array([[3], [2]])  # (batch, seq)
    layer = _layers()[name]()
    masks = dict(query_mask=real, value_mask=real)  # padded queries and keys (a bare query_mask masks no key)
    clean = np.asarray(layer(np.where(real[..., None], _X, 0.0).astype(np.float32), **masks))
    for poison in (np.nan, np.inf):
        poisoned = np.asarray(layer(np.where(real[..., None], _X, poison).astype(np.float32), **masks))
        np.testing.assert_allclose(poisoned[real], clean[real], atol=1e-6)


def test_the_largest_float32_scale_is_taken_and_one_past_it_refused_by_every_kernel():
    """A scale past float32's largest value is `inf` in the float32 logits (NaN outputs); each kernel's
    own function, called directly, refuses it naming `scale`, as the dispatcher does."""
    from keras_attn.kernels import KERNELS

    q = np.random.default_rng(1).normal(size=(1, 3, 2, 4)).astype(np.float32)
    largest = float(np.finfo(np.float32).max)
    output = np.asarray(scaled_dot_product_attention(q, q, q, scale=largest))
    # The weights are one-hot on each row's largest logit: the float64 reference at a large scale.
    expected, _ = reference.attention(q, q, q, scale=1e6)
    np.testing.assert_allclose(output, expected, atol=1e-5)
    for name, kernel in KERNELS.items():
        with pytest.raises(ValueError, match=r"`scale`.*Received: scale=3\.5e\+38"):
            getattr(kernel, f"{name}_attention")(q, q, q, scale=3.5e38)
    with pytest.raises(ValueError, match=r"Received: scale=<tf.Tensor.*3\.5e\+38"):
        scaled_dot_product_attention(q, q, q, scale=tf.constant(3.5e38, tf.float64))


# (mask builder, arguments, the text the ValueError must hold: the argument and the value received)
BAD_MASK_ARGUMENTS = [
    ("causal_mask", (-1, -1), {}, "Received: query_len=-1"),
    ("causal_mask", (2.5, 3), {}, "Received: query_len=2.5"),
    ("causal_mask", (3, 2.0), {}, "Received: key_len=2.0"),
    ("causal_mask", (3, 3), {"query_offset": -2}, "Received: query_offset=-2"),
    ("sliding_window_mask", (3, -3, 2), {}, "Received: key_len=-3"),
    ("sliding_window_mask", (3, 3, 2), {"query_offset": 0.5}, "Received: query_offset=0.5"),
    ("Strided.block_mask", (4, 4), {"key_offset": -1}, "Received: key_offset=-1"),
    ("BlockLocal.block_mask", ("4", 4), {}, "Received: query_len='4'"),
]


@pytest.mark.parametrize(
    "builder, arguments, keywords, message",
    BAD_MASK_ARGUMENTS,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_MASK_ARGUMENTS)],
)
def test_mask_builders_name_a_bad_length_or_offset(builder, arguments, keywords, message):
    import keras_attn
    from keras_attn import patterns

    build = {
        "causal_mask": keras_attn.causal_mask,
        "sliding_window_mask": keras_attn.sliding_window_mask,
        "Strided.block_mask": patterns.Strided(2).block_mask,
        "BlockLocal.block_mask": patterns.BlockLocal(2).block_mask,
    }[builder]
    with pytest.raises(ValueError, match=r"must be an int in \[0, 2147483647\] or an integer tensor") as error:
        build(*arguments, **keywords)
    assert message in str(error.value)
    # Integer tensors (a length known when a graph runs) are still taken.
    assert tuple(keras_attn.causal_mask(tf.constant(2), tf.constant(3)).shape) == (1, 1, 2, 3)


@pytest.mark.parametrize("attention_axes", [(1, 2), (2,)])
def test_a_causal_mask_over_several_attention_axes_is_refused_naming_them(attention_axes):
    """Keras's causal mask orders the positions of axis 1: over two axes (or another one) Keras and
    this layer failed inside the softmax ("axis -5 is out of bounds", a mask not broadcastable)."""
    import keras_attn

    x = np.random.default_rng(0).normal(size=(2, 3, 4, 8)).astype(np.float32)
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=attention_axes)
    assert tuple(layer(x, x).shape) == (2, 3, 4, 8)  # without the causal mask the axes work
    with pytest.raises(ValueError, match="causal mask over more than one attention axis") as error:
        layer(x, x, use_causal_mask=True)
    assert f"attention_axes={attention_axes}" in str(error.value) and "use_causal_mask=True" in str(error.value)
    # Axis 1 of a rank-4 input takes the causal mask: Keras's layer with the same weights.
    import keras

    single = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1,))
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1,))
    single(x, x), theirs(x, x)
    theirs.set_weights(single.get_weights())
    np.testing.assert_allclose(single(x, x, use_causal_mask=True), theirs(x, x, use_causal_mask=True), atol=1e-5)


def _family(name):
    """A small layer of the registry's family `name` (the families' required sizes)."""
    extra = {"linformer": {"max_length": 8, "projected_length": 4}, "lsh": {"num_buckets": 2, "chunk_size": 2}}
    assert set(extra) <= set(FAMILIES)
    return build(name, num_heads=2, key_dim=4, **extra.get(name, {}))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_an_input_of_another_width_or_rank_than_built_for_is_refused_naming_it(name):
    """Every family: a built layer called on another feature size (or rank) names the input, the shape it
    was built for and the one received (TensorFlow's "Input to reshape is a tensor with 1296 values")."""
    layer = _family(name)
    built = np.asarray(layer(_X))
    for bad in (np.ones((2, 4, 9), np.float32), np.ones((4, 8), np.float32)):
        with pytest.raises(ValueError) as error:
            layer(bad)
        message = str(error.value)
        assert "`query`" in message and "query.shape=(None, None, 8)" in message, message
        assert f"query.shape={bad.shape}" in message, message
    np.testing.assert_array_equal(np.asarray(layer(_X)), built)  # the right width still works


def test_cross_attention_names_the_value_or_key_of_another_width():
    import keras_attn

    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    context = np.ones((2, 5, 6), np.float32)
    layer(_X, context, context[..., :3])  # built: query 8, value 6, key 3 features
    for args, name, built, received in (
        ((_X, context[..., :5], context[..., :3]), "value", "(None, None, 6)", "(2, 5, 5)"),
        ((_X, context, context), "key", "(None, None, 3)", "(2, 5, 6)"),
    ):
        with pytest.raises(ValueError, match=f"`{name}`") as error:
            layer(*args)
        assert f"Expected: {name}.shape={built}, received: {name}.shape={received}" in str(error.value)
