"""LinformerSelfAttention against a NumPy float64 reference (padding removed, then projected)."""

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

from keras_attn.families.linformer_attention import LinformerSelfAttention
from tests import reference
from tests.layer_checks import assert_gradients_match_finite_differences
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_mixed_precision_close
from tests.layer_checks import assert_padding_invariant
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import padded_token_ids

VARIANTS = [dict(), dict(share_key_value=True), dict(projection_per_head=True)]
ATOL = 1e-5
PADDING = np.arange(9)[None, :] < np.array([[9], [5]])


def _layer(**kwargs):
    config = dict(num_heads=2, key_dim=4, value_dim=3, max_length=12, projected_length=5, seed=3)
    config.update(bias_initializer="random_normal")
    config.update(kwargs)
    return LinformerSelfAttention(**config)


def _inputs(seed=0, shape=(2, 9, 6)):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _reference(layer, x, mask=None, return_weights=False):
    """Float64: each sequence's real tokens alone, projected by the leading rows, dense attention
    (and its weights over the projected keys, `(batch, heads, seq, projected_length)`)."""
    weights = {w.path.split("/", 1)[1]: w.numpy().astype(np.float64) for w in layer.weights}
    query, key, value = (
        reference.project_heads(x, weights[f"{name}/kernel"], weights[f"{name}/bias"])
        for name in ("query", "key", "value")
    )
    key_projection = weights["key_length_projection"]
    value_projection = weights.get("value_length_projection", key_projection)
    mask = np.ones(x.shape[:2], bool) if mask is None else np.asarray(mask, bool)
    attended = np.zeros(query.shape[:3] + (value.shape[-1],))
    scores = np.zeros((x.shape[0], layer.num_heads, x.shape[1], layer.projected_length))
    for b in range(x.shape[0]):
        real = np.flatnonzero(mask[b])
        for h in range(layer.num_heads):
            e = key_projection[h] if layer.projection_per_head else key_projection
            f = value_projection[h] if layer.projection_per_head else value_projection
            projected_key = e[: len(real)].T @ key[b, real, h]  # (projected_length, key_dim)
            projected_value = f[: len(real)].T @ value[b, real, h]
            out, probabilities = reference.attention(
                query[None, b, :, h, None], projected_key[None, :, None], projected_value[None, :, None]
            )
            attended[b, :, h] = out[0, :, 0] * mask[b, :, None]
            scores[b, h] = probabilities[0, 0] * mask[b, :, None]
    output = reference.merge_heads(
        attended, weights["attention_output/kernel"], weights["attention_output/bias"], rows=mask
    )
    return (output, scores) if return_weights else output


@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_float64_reference_with_padding(variant):
    x = _inputs()
    layer = _layer(**variant)
    np.testing.assert_allclose(
        layer(x, query_mask=PADDING, value_mask=PADDING), _reference(layer, x, PADDING), atol=ATOL
    )


def test_weight_shapes_per_variant():
    shapes = {}
    for name, variant in zip(("separate", "shared", "per_head"), VARIANTS):
        layer = _layer(**variant)
        layer(_inputs())
        shapes[name] = [tuple(w.shape) for w in layer.weights if "length_projection" in w.path]
    assert shapes == {"separate": [(12, 5), (12, 5)], "shared": [(12, 5)], "per_head": [(2, 12, 5), (2, 12, 5)]}


def test_identity_projection_of_full_length_equals_dense_attention():
    x = _inputs(1, (2, 7, 6))
    layer = _layer(max_length=7, projected_length=7, projection_initializer="identity")
    output = layer(x)
    weights = {w.path.split("/", 1)[1]: w.numpy() for w in layer.weights}
    query, key, value = (
        reference.project_heads(x, weights[f"{name}/kernel"], weights[f"{name}/bias"])
        for name in ("query", "key", "value")
    )
    dense, _ = reference.attention(query, key, value)
    expected = reference.merge_heads(dense, weights["attention_output/kernel"], weights["attention_output/bias"])
    np.testing.assert_allclose(output, expected, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_content_amount_and_place_never_change_real_outputs(variant):
    x = _inputs(2)
    layer = _layer(use_bias=False, **variant)
    assert_padding_invariant(layer, x, PADDING)
    left_padded = np.concatenate([x[1:, 5:], x[1:, :5]], axis=1)  # the same 5 tokens after 4 pads
    left_mask = np.arange(9)[None, :] >= 4
    np.testing.assert_allclose(
        layer(left_padded, query_mask=left_mask, value_mask=left_mask)[0, 4:],
        layer(x, query_mask=PADDING, value_mask=PADDING)[1, :5],
        atol=1e-5,
    )


def test_causal_request_explains_why_it_is_refused():
    with pytest.raises(ValueError, match="future positions included.*causal=True"):
        _layer(causal=True)


def test_longer_than_max_length_is_refused():
    with pytest.raises(ValueError, match="max_length=12"):
        _layer()(_inputs(4, (1, 13, 6)))


@pytest.mark.parametrize("kwargs", [dict(max_length=0), dict(projected_length=2.5)])
def test_bad_lengths_are_named(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        _layer(**kwargs)


def test_mixed_precision_close_to_float32():
    assert_mixed_precision_close(_layer, _inputs(5))


@pytest.mark.parametrize("variant", VARIANTS)
def test_jit_equals_eager(variant):
    layer = _layer(**variant)
    layer(_inputs(6))
    assert_jit_matches_eager(layer, _inputs(6), query_mask=PADDING, value_mask=PADDING)


def test_gradients_match_finite_differences():
    assert_gradients_match_finite_differences(
        lambda: _layer(projection_per_head=True),
        _inputs(7, (1, 6, 6)),
        query_mask=np.array([[1, 1, 0, 1, 1, 0]], bool),
        value_mask=np.array([[1, 1, 0, 1, 1, 0]], bool),
    )


def _token_model():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6, mask_zero=True)(tokens)
    attended = _layer()(embedded)
    return keras.Model(tokens, attended)


def test_serialization_round_trip_and_keras_mask():
    tokens = padded_token_ids(np.random.default_rng(8), [6, 4], 6, 30)
    reloaded = assert_serialization_round_trip(_token_model, tokens)
    assert type(reloaded.layers[2]) is LinformerSelfAttention
    layer, embedded = reloaded.layers[2], reloaded.layers[1](tokens)
    np.testing.assert_array_equal(layer(embedded)._keras_mask, tokens != 0)
    np.testing.assert_allclose(
        reloaded(tokens), layer(embedded, query_mask=tokens != 0, value_mask=tokens != 0), atol=1e-6
    )


def test_run_layer_test():
    TestCase().run_layer_test(
        LinformerSelfAttention,
        init_kwargs=dict(num_heads=2, key_dim=4, max_length=16, projected_length=4),
        input_shape=(2, 7, 6),
        expected_output_shape=(2, 7, 6),
        expected_num_trainable_weights=10,
        expected_num_non_trainable_weights=0,
        supports_masking=True,
    )
