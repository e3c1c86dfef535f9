"""scaled_dot_product_attention at its edges: bad inputs get a ValueError naming the argument and
the value; NaN/inf in padded keys and values never reach a real output, on every kernel."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attn.attention import scaled_dot_product_attention
from tests import reference

_Q = np.zeros((1, 3, 2, 4), np.float32)

# (what, keyword arguments, text the message must hold: the argument and the value received)
BAD_INPUTS = [
    ("int query", {"query": _Q.astype(np.int32)}, "`query` must be a floating tensor. Received: query.dtype=int32"),
    ("int key", {"key": _Q.astype(np.int64)}, "key.dtype=int64"),
    ("int value", {"value": _Q.astype(np.int32)}, "value.dtype=int32"),
    ("bool value", {"value": _Q.astype(bool)}, "value.dtype=bool"),
    ("zero scale", {"scale": 0.0}, "`scale` must be a positive finite number or None. Received: scale=0.0"),
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
    implementation=st.sampled_from(["dense", "chunked", "blockwise"]),
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
    expected, _ = reference.attention(q, np.where(real[..., None, None], k, 0), np.where(real[..., None, None], v, 0),
                                      mask=mask, is_causal=is_causal)
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
    from keras_attn.masked_global_pooling import MaskedGlobalPooling

    inputs = np.ones((2, 5, 3), np.float32)
    with pytest.raises(ValueError, match=rf"`mask` must have shape \(batch, seq\)=\(2, 5\)\. Received: mask\.shape="):
        MaskedGlobalPooling()(inputs, mask=np.ones(mask_shape, bool))


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_masked_global_pooling_broadcast_free_mask_matches_numpy(mode):
    from keras_attn.masked_global_pooling import MaskedGlobalPooling

    rng = np.random.default_rng(1)
    inputs = rng.normal(size=(2, 5, 3)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    expected = np.stack([getattr(np, mode)(inputs[b][mask[b]].astype(np.float64), axis=0) for b in range(2)])
    np.testing.assert_allclose(MaskedGlobalPooling(mode)(inputs, mask=mask), expected, atol=1e-6)


def _cached_layer():
    from keras_attn.multi_head_attention import MultiHeadAttention

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
    from keras_attn.transformer_decoder import TransformerDecoder

    decoder = TransformerDecoder(intermediate_dim=8, num_heads=2)
    x = np.ones((1, 1, 8), np.float32)
    decoder(x)
    with pytest.raises(ValueError, match="Received: self_attention_cache_update_index=None"):
        decoder(x, self_attention_cache=np.zeros((1, 2, 4, 2, 4), np.float32))
