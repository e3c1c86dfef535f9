"""LSHSelfAttention against a NumPy float64 query-by-query Reformer reference."""

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

from keras_attn.families.lsh_attention import LSHSelfAttention
from tests import reference
from tests.layer_checks import assert_gradients_match_finite_differences
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_mixed_precision_close
from tests.layer_checks import assert_padding_invariant
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import padded_token_ids

ATOL = 1e-5
PADDING = np.arange(11)[None, :] < np.array([[11], [6]])


def _layer(**kwargs):
    config = dict(num_heads=2, key_dim=4, value_dim=3, num_buckets=4, num_hashes=2, chunk_size=3, seed=5)
    config.update(bias_initializer="random_normal")
    config.update(kwargs)
    return LSHSelfAttention(**config)


def _inputs(seed=0, shape=(2, 11, 6)):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _weights(layer):
    return {w.path.split("/", 1)[1]: w.numpy().astype(np.float64) for w in layer.weights}


def _projected(layer, x):
    weights = _weights(layer)
    query, value = (
        reference.project_heads(x, weights[f"{name}/kernel"], weights.get(f"{name}/bias"))
        for name in ("query", "value")
    )
    return weights, query, value


def _reference(layer, x, mask=None, is_causal=None, return_weights=False):
    """Float64 output (and weights) of `layer`; causal as the layer unless `is_causal` says."""
    weights, query, value = _projected(layer, x)
    attended, scores = reference.lsh_attention(
        query,
        value,
        weights["rotations"],
        layer.num_buckets,
        layer.chunk_size,
        mask,
        layer.causal if is_causal is None else is_causal,
        return_weights=True,
    )
    output = reference.merge_heads(
        attended, weights["attention_output/kernel"], weights["attention_output/bias"], rows=mask
    )
    return (output, scores) if return_weights else output


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_hashes", [1, 3])
def test_matches_float64_reference_with_padding(causal, num_hashes):
    x = _inputs()
    layer = _layer(causal=causal, num_hashes=num_hashes)
    np.testing.assert_allclose(
        layer(x, query_mask=PADDING, value_mask=PADDING), _reference(layer, x, PADDING), atol=ATOL
    )


@pytest.mark.parametrize("causal", [False, True])
def test_one_bucket_one_chunk_equals_dense_shared_qk_attention_without_self(causal):
    x = _inputs(1, (2, 7, 6))
    layer = _layer(num_buckets=1, num_hashes=1, chunk_size=8, causal=causal)
    output = layer(x, query_mask=PADDING[:, :7], value_mask=PADDING[:, :7])
    weights, query, value = _projected(layer, x)
    key = query / np.linalg.norm(query, axis=-1, keepdims=True)
    others = ~np.eye(7, dtype=bool)
    allowed = PADDING[:, None, None, :7] & PADDING[:, None, :7, None]
    if causal:
        allowed = allowed & np.tril(np.ones((7, 7), bool))
    # A token sees itself only when nothing else is allowed: token 0 of a causal sequence.
    nothing_else = ~np.any(allowed & others, axis=-1, keepdims=True)
    dense, _ = reference.attention(query, key, value, mask=allowed & (others | nothing_else))
    expected = reference.merge_heads(
        dense, weights["attention_output/kernel"], weights["attention_output/bias"], rows=PADDING[:, :7]
    )
    np.testing.assert_allclose(output, expected, atol=ATOL)


def test_causal_outputs_never_see_future_tokens():
    x = _inputs(2, (1, 12, 6))
    layer = _layer(causal=True, num_buckets=2, chunk_size=4)
    before = layer(x).numpy()
    changed = x.copy()
    changed[:, 7:] = 100.0 * _inputs(3, (1, 5, 6))  # future tokens that reorder the sort
    after = layer(changed).numpy()
    np.testing.assert_allclose(after[:, :7], before[:, :7], atol=1e-6)
    assert not np.allclose(after[:, 7:], before[:, 7:], atol=1e-3)


def test_padding_content_and_appended_padding_never_change_real_outputs():
    assert_padding_invariant(_layer(use_bias=False), _inputs(4), PADDING)


def test_a_lone_token_attends_to_itself():
    layer = _layer(use_bias=False, causal=True)
    x = _inputs(6, (1, 1, 6))
    output = layer(x)
    _, _, value = _projected(layer, x)
    expected = reference.merge_heads(value, _weights(layer)["attention_output/kernel"])
    np.testing.assert_allclose(output, expected, atol=ATOL)


@pytest.mark.parametrize("length", [1, 5, 37])
def test_any_length_and_deterministic_inference(length):
    layer = _layer(chunk_size=8)
    x = _inputs(7, (1, length, 6))
    first = layer(x, training=True).numpy()
    np.testing.assert_array_equal(layer(x, training=False), first)
    np.testing.assert_allclose(first, _reference(layer, x), atol=ATOL)


def test_fp16_is_finite_at_65536_tokens():
    keras.config.set_dtype_policy("mixed_float16")
    layer = LSHSelfAttention(num_heads=1, key_dim=8, num_buckets=64, num_hashes=1, chunk_size=128, seed=0)
    output = layer(4.0 * _inputs(8, (1, 65536, 8))).numpy()
    assert output.dtype == np.float16 and np.all(np.isfinite(output))


def test_mixed_precision_close_to_float32():
    assert_mixed_precision_close(_layer, _inputs(9))


@pytest.mark.parametrize("causal", [False, True])
def test_jit_equals_eager(causal):
    layer = _layer(causal=causal)
    layer(_inputs(10))
    assert_jit_matches_eager(layer, _inputs(10), query_mask=PADDING, value_mask=PADDING)


def test_gradients_match_finite_differences():
    assert_gradients_match_finite_differences(
        lambda: _layer(chunk_size=2),
        _inputs(11, (1, 6, 6)),
        query_mask=np.array([[1, 1, 1, 0, 1, 1]], bool),
        value_mask=np.array([[1, 1, 1, 0, 1, 1]], bool),
    )


def _token_model():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6, mask_zero=True)(tokens)
    attended = _layer(causal=True)(embedded)
    return keras.Model(tokens, attended)


def test_serialization_round_trip_keeps_the_rotations_and_keras_mask():
    tokens = padded_token_ids(np.random.default_rng(12), [7, 4], 7, 30)
    reloaded = assert_serialization_round_trip(_token_model, tokens)
    layer, embedded = reloaded.layers[2], reloaded.layers[1](tokens)
    assert type(layer) is LSHSelfAttention
    np.testing.assert_array_equal(layer(embedded)._keras_mask, tokens != 0)
    np.testing.assert_allclose(
        reloaded(tokens), layer(embedded, query_mask=tokens != 0, value_mask=tokens != 0), atol=1e-6
    )


def test_run_layer_test():
    TestCase().run_layer_test(
        LSHSelfAttention,
        init_kwargs=dict(num_heads=2, key_dim=4, num_buckets=2, chunk_size=4, seed=1),
        input_shape=(2, 7, 6),
        expected_output_shape=(2, 7, 6),
        expected_num_trainable_weights=6,
        expected_num_non_trainable_weights=1,
        expected_num_seed_generators=1,
        supports_masking=True,
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [(dict(num_buckets=3), "num_buckets"), (dict(chunk_size=0), "chunk_size"), (dict(num_hashes=None), "num_hashes")],
)
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _layer(**kwargs)


def _packed(lengths, length, seed):
    """`(x, segment_ids)` of one packed row holding documents of `lengths`, then padding up to `length`."""
    segment_ids = np.zeros((1, length), "int32")
    segment_ids[0, : sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    return _inputs(seed, (1, length, 6)), segment_ids


def test_causal_packed_documents_of_any_length_equal_each_alone_in_float64():
    """Causal, a token's keys are the `chunk_size` latest of its bucket in its document: no chunk alignment needed."""
    x, segment_ids = _packed((5, 7, 4), 18, 7)
    layer = _layer(causal=True)
    output = layer(x, segment_ids=segment_ids).numpy()
    for document in (1, 2, 3):
        tokens = segment_ids[0] == document
        np.testing.assert_allclose(output[:, tokens], _reference(layer, x[:, tokens]), atol=ATOL)
    assert np.all(output[:, segment_ids[0] == 0] == 0)


def test_packed_documents_of_any_length_never_attend_across():
    """Non-causal with chunks that straddle documents: weights only inside a document, rows summing to 1, and
    another document's content never changes an output (the sort places each document by its bounds alone)."""
    x, segment_ids = _packed((5, 7, 4), 18, 8)
    layer = _layer()
    output, scores = layer(x, segment_ids=segment_ids, return_attention_scores=True)
    scores = scores.numpy()  # (1, heads, 18, 18)
    same = (segment_ids[0][:, None] == segment_ids[0][None, :]) & (segment_ids[0][:, None] != 0)
    assert np.all(scores[:, :, ~same] == 0)
    real = segment_ids[0] != 0
    np.testing.assert_allclose(scores.sum(-1)[:, :, real], 1.0, atol=1e-5)
    changed = x.copy()
    changed[:, segment_ids[0] == 2] = 100.0 * _inputs(9, (1, 7, 6))
    others = segment_ids[0] != 2
    np.testing.assert_allclose(layer(changed, segment_ids=segment_ids).numpy()[:, others], output.numpy()[:, others])
