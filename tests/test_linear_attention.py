"""LinearAttention (elu+1, FAVOR+) against a NumPy float64 token-by-token recurrence."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.testing import TestCase

from keras_attn.families import linear_attention
from keras_attn.families.linear_attention import LinearAttention
from tests import reference
from tests.layer_checks import assert_gradients_match_finite_differences
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_mixed_precision_close
from tests.layer_checks import assert_outputs_close
from tests.layer_checks import assert_padding_invariant
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import padded_token_ids

FAMILIES = [("elu", False), ("elu", True), ("favor", False), ("favor", True)]
ATOL = 2e-5


def _layer(feature_map, causal, **kwargs):
    config = dict(num_heads=2, key_dim=4, value_dim=3, feature_map=feature_map, causal=causal, chunk_size=4, seed=7)
    config.update(bias_initializer="random_normal")
    config.update(kwargs)
    return LinearAttention(**config)


def _reference(layer, x, mask=None, is_causal=None, return_weights=False):
    """Float64 output of `layer` from its weights: projections, features, recurrence, projection (and
    the normalised kernel weights); causal as the layer unless `is_causal` says."""
    is_causal = layer.causal if is_causal is None else is_causal
    weights = {w.path.split("/", 1)[1]: w.numpy() for w in layer.weights}
    query, key, value = (
        reference.project_heads(x, weights[f"{name}/kernel"], weights[f"{name}/bias"])
        for name in ("query", "key", "value")
    )
    if layer.feature_map == "elu":
        query_features, key_features = reference.elu_plus_one(query), reference.elu_plus_one(key)
    else:
        scale = layer.key_dim**-0.25
        query_features = reference.favor_features(query * scale, weights["random_features"])
        key_features = reference.favor_features(key * scale, weights["random_features"])
    attended = reference.linear_attention_recurrence(query_features, key_features, value, mask, is_causal)
    output = reference.merge_heads(
        attended, weights["attention_output/kernel"], weights["attention_output/bias"], rows=mask
    )
    if not return_weights:
        return output
    return output, reference.linear_attention_weights(query_features, key_features, mask, is_causal)


def _inputs(seed=0, shape=(2, 11, 6)):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


PADDING = np.arange(11)[None, :] < np.array([[11], [7]])


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_matches_float64_recurrence_with_padding(feature_map, causal):
    x = _inputs()
    layer = _layer(feature_map, causal)
    output = layer(x, query_mask=PADDING, value_mask=PADDING)
    np.testing.assert_allclose(output, _reference(layer, x, PADDING), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_causal_last_position_equals_non_causal(feature_map):
    x = _inputs(1)
    causal = _layer(feature_map, True)
    non_causal = _layer(feature_map, False)
    causal(x), non_causal(x)
    non_causal.set_weights(causal.get_weights())
    np.testing.assert_allclose(causal(x)[:, -1], non_causal(x)[:, -1], atol=ATOL)


def test_favor_estimates_softmax_attention_with_many_features():
    rng = np.random.default_rng(2)
    query, key = rng.standard_normal((2, 1, 32, 1, 4)) * 0.5
    value = rng.standard_normal((1, 32, 1, 3))
    layer = _layer("favor", False, num_heads=1, num_random_features=4096)
    layer(np.zeros((1, 32, 6), "float32"))
    expected, _ = reference.attention(query, key, value)
    features = layer.features(query.astype("float32"), key.astype("float32"))
    estimate = reference.linear_attention_recurrence(*features, value)
    np.testing.assert_allclose(estimate, expected, atol=0.05)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_causal_outputs_never_see_future_tokens(feature_map):
    x = _inputs(3, (1, 13, 6))
    layer = _layer(feature_map, True)
    before = layer(x).numpy()
    changed = x.copy()
    changed[:, 6:] = 100.0 * _inputs(4, (1, 7, 6))  # large, so a leak through any statistic would show
    after = layer(changed).numpy()
    np.testing.assert_allclose(after[:, :6], before[:, :6], atol=1e-6)
    assert not np.allclose(after[:, 6:], before[:, 6:], atol=1e-3)


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_padding_content_and_appended_padding_never_change_real_outputs(feature_map, causal):
    assert_padding_invariant(_layer(feature_map, causal, use_bias=False), _inputs(5), PADDING)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_cached_decoding_equals_the_full_causal_pass_with_constant_state(feature_map):
    x = _inputs(8, (2, 10, 6))
    layer = _layer(feature_map, True)
    full = layer(x).numpy()
    cache = layer.initial_cache(2)
    shapes = [tuple(c.shape) for c in cache]
    steps = []
    for start, stop in ((0, 3), (3, 4), (4, 10)):  # a prompt, one token, then a longer step
        output, cache = layer(x[:, start:stop], cache=cache)
        steps.append(output.numpy())
        assert [tuple(c.shape) for c in cache] == shapes
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=ATOL)


def _output_and_gradients(layer, x, mask, cotangent, jit_compile=None):
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, query_mask=mask, value_mask=mask) * cotangent)
        return layer(x, query_mask=mask, value_mask=mask), tape.gradient(loss, [x] + layer.trainable_weights)

    return run(tf.constant(x)) if jit_compile is None else tf.function(run, jit_compile=jit_compile)(tf.constant(x))


# Each feature map once in `make test` (the causal favor and the packed elu runs are `slow`).
@pytest.mark.parametrize("feature_map", ["elu", pytest.param("favor", marks=pytest.mark.slow)])
def test_long_causal_inputs_in_recomputed_segments_equal_one_pass(monkeypatch, feature_map):
    """Past `RECOMPUTE_SEGMENT_LENGTH` tokens the causal layer runs in segments: same outputs and gradients."""
    x, layer = _inputs(16, (2, 23, 6)), _layer(feature_map, True, chunk_size=3)
    mask = np.arange(23)[None, :] < np.array([[23], [15]])
    cotangent = np.random.default_rng(17).standard_normal((2, 23, 6)).astype("float32")
    expected = _output_and_gradients(layer, x, mask, cotangent)
    monkeypatch.setattr(linear_attention, "RECOMPUTE_SEGMENT_LENGTH", 5)  # 5 segments, the last of 3 tokens
    for jit_compile in (None, False, True):
        assert_outputs_close(
            _output_and_gradients(layer, x, mask, cotangent, jit_compile), expected, atol=2e-6, rtol=1e-5
        )
    np.testing.assert_allclose(
        layer(x, query_mask=mask, value_mask=mask), _reference(layer, x, mask), atol=ATOL, rtol=1e-4
    )


def test_redraw_changes_training_features_only():
    x = _inputs(9)
    layer = _layer("favor", False, redraw_features=True)
    inference = layer(x, training=False).numpy()
    np.testing.assert_array_equal(layer(x, training=False), inference)
    first, second = layer(x, training=True).numpy(), layer(x, training=True).numpy()
    assert not np.allclose(first, second, atol=1e-4)


def test_fp16_is_finite_at_65536_tokens():
    keras.config.set_dtype_policy("mixed_float16")
    layer = LinearAttention(num_heads=1, key_dim=8, feature_map="elu", causal=True, chunk_size=256, seed=0)
    x = 4.0 * _inputs(10, (1, 65536, 8))  # fp16 sums of these keys would overflow (> 65504)
    output = layer(x).numpy()
    assert output.dtype == np.float16 and np.all(np.isfinite(output))


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_mixed_precision_close_to_float32(feature_map, causal):
    assert_mixed_precision_close(lambda: _layer(feature_map, causal), _inputs(11))


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_jit_equals_eager(feature_map, causal):
    layer = _layer(feature_map, causal)
    layer(_inputs(12))
    assert_jit_matches_eager(layer, _inputs(12), query_mask=PADDING, value_mask=PADDING)


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_gradients_match_finite_differences(feature_map, causal):
    assert_gradients_match_finite_differences(
        lambda: _layer(feature_map, causal),
        _inputs(13, (1, 6, 6)),
        query_mask=np.array([[1, 1, 1, 1, 1, 0]], bool),
        value_mask=np.array([[1, 1, 1, 1, 1, 0]], bool),
    )


def _token_model():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6, mask_zero=True)(tokens)
    attended = _layer("favor", True)(embedded)
    return keras.Model(tokens, attended)


def test_serialization_round_trip_keeps_the_random_features():
    tokens = padded_token_ids(np.random.default_rng(14), [6, 4], 6, 30)
    reloaded = assert_serialization_round_trip(_token_model, tokens)
    assert type(reloaded.layers[2]) is LinearAttention


def test_keras_mask_is_used_and_propagated():
    tokens = padded_token_ids(np.random.default_rng(15), [6, 4], 6, 30)
    model = _token_model()
    output = model.layers[2](model.layers[1](tokens))
    np.testing.assert_array_equal(output._keras_mask, tokens != 0)
    np.testing.assert_allclose(
        model(tokens),
        model.layers[2](model.layers[1](tokens), query_mask=tokens != 0, value_mask=tokens != 0),
        atol=1e-6,
    )


def test_run_layer_test():
    TestCase().run_layer_test(
        LinearAttention,
        init_kwargs=dict(num_heads=2, key_dim=4, feature_map="favor", causal=True, chunk_size=4),
        input_shape=(2, 7, 6),
        expected_output_shape=(2, 7, 6),
        expected_num_trainable_weights=8,
        expected_num_non_trainable_weights=1,
        expected_num_seed_generators=1,
        supports_masking=True,
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(feature_map="relu"), "feature_map"),
        (dict(feature_map="elu", redraw_features=True), "redraw_features"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(num_random_features=-1), "num_random_features"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LinearAttention(num_heads=2, key_dim=4, **kwargs)


def test_cache_on_a_non_causal_layer_is_refused():
    layer = _layer("elu", False)
    with pytest.raises(ValueError, match="causal"):
        layer(_inputs(), cache=layer.initial_cache(2))


# Two packed rows: documents of 5, 3, 9 and 1 tokens then padding; of 10 and 13 tokens. Chunks of 4 straddle them.
PACKED_IDS = np.array([[1] * 5 + [2] * 3 + [3] * 9 + [4] + [0] * 5, [7] * 10 + [8] * 13])


@pytest.mark.parametrize("feature_map,causal", FAMILIES)
def test_packed_documents_equal_each_alone_in_float64(feature_map, causal):
    x, layer = _inputs(20, (2, 23, 6)), _layer(feature_map, causal)
    output, scores = (t.numpy() for t in layer(x, segment_ids=PACKED_IDS, return_attention_scores=True))
    for row, ids in enumerate(PACKED_IDS):
        for document in set(ids) - {0}:
            tokens = ids == document
            alone, alone_scores = _reference(layer, x[row : row + 1, tokens], return_weights=True)
            np.testing.assert_allclose(output[row : row + 1, tokens], alone, atol=ATOL)
            np.testing.assert_allclose(scores[row : row + 1][:, :, tokens][..., tokens], alone_scores, atol=ATOL)
    assert np.all(output[PACKED_IDS == 0] == 0)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_cached_decoding_of_packed_rows_restarts_at_each_document(feature_map):
    """Steps that start, cross and end documents give the full packed pass; the state holds its document."""
    x, layer = _inputs(21, (2, 23, 6)), _layer(feature_map, True)
    full = layer(x, segment_ids=PACKED_IDS).numpy()
    cache = layer.initial_cache(2, segments=True)
    steps = []
    for start, stop in ((0, 5), (5, 6), (6, 11), (11, 17), (17, 18), (18, 23)):  # row 0: a new document at 5 and 17
        output, cache = layer(x[:, start:stop], segment_ids=PACKED_IDS[:, start:stop], cache=cache)
        steps.append(output.numpy())
        np.testing.assert_array_equal(cache[2], PACKED_IDS[:, stop - 1])
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=ATOL)
    following = _inputs(24, (1, 1, 6))  # one more token of row 1's last document decodes as if alone
    np.testing.assert_allclose(
        layer(following, segment_ids=[[8]], cache=tuple(part[1:] for part in cache))[0],
        _reference(layer, np.concatenate([x[1:, 10:], following], axis=1))[:, -1:],
        atol=ATOL,
    )


def test_a_cache_without_its_document_is_refused_with_segment_ids():
    layer = _layer("elu", True)
    with pytest.raises(ValueError, match=r"initial_cache`\(batch, segments=True\).*segment_ids.shape=\(2, 11\)"):
        layer(_inputs(), segment_ids=np.ones((2, 11), "int32"), cache=layer.initial_cache(2))
    with pytest.raises(ValueError, match=r"`cache` must be the recurrent state"):
        layer(_inputs(), cache=layer.initial_cache(2, segments=True))


@pytest.mark.parametrize("feature_map", [pytest.param("elu", marks=pytest.mark.slow), "favor"])
def test_long_packed_inputs_in_recomputed_segments_equal_one_pass(monkeypatch, feature_map):
    """The recomputed segments carry the state's document too: documents cross the segments' borders."""
    x, layer = _inputs(22, (2, 23, 6)), _layer(feature_map, True, chunk_size=3)
    cotangent = np.random.default_rng(23).standard_normal((2, 23, 6)).astype("float32")

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            output = layer(x, segment_ids=PACKED_IDS)
            loss = tf.reduce_sum(output * cotangent)
        return output, tape.gradient(loss, [x] + layer.trainable_weights)

    expected = run(tf.constant(x))
    monkeypatch.setattr(linear_attention, "RECOMPUTE_SEGMENT_LENGTH", 5)  # documents start at 5, 8, 10, 17
    for jit_compile in (None, True):
        actual = run(tf.constant(x)) if jit_compile is None else tf.function(run, jit_compile=True)(tf.constant(x))
        assert_outputs_close(actual, expected, atol=2e-5, rtol=1e-5)
