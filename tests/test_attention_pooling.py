"""AttentionPooling against a NumPy float64 attention from its own query and weights."""

import keras
import numpy as np
import pytest

from keras_attn import AttentionPooling
from tests import layer_checks
from tests.layer_checks import run_layer_test
from tests.packed_rows import packed_rows


def numpy_attention_pooling(layer, values, mask):
    """Float64 oracle: the learnt query's multi-head softmax attention over the real positions."""
    attention = layer.attention
    weights = {w.path.split("/", 1)[1]: keras.ops.convert_to_numpy(w).astype(np.float64) for w in layer.weights}
    values = np.asarray(values, np.float64)
    query = weights["query"][:, 0] @ weights["attention/query/kernel"].reshape(values.shape[-1], -1)  # (1, heads * dim)
    query = (query + weights["attention/query/bias"].reshape(1, -1)).reshape(attention.num_heads, -1)  # (heads, dim)
    pooled = np.zeros((values.shape[0], values.shape[2]))
    for row, (sequence, keep) in enumerate(zip(values, np.asarray(mask, bool))):
        if not keep.any():
            continue
        keys = np.einsum("sf,fhd->shd", sequence, weights["attention/key/kernel"]) + weights["attention/key/bias"]
        vals = np.einsum("sf,fhd->shd", sequence, weights["attention/value/kernel"]) + weights["attention/value/bias"]
        logits = np.einsum("hd,shd->hs", query, keys) / np.sqrt(attention.key_dim)
        logits = np.where(keep[None, :], logits, -np.inf)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)  # (heads, seq)
        heads = np.einsum("hs,shd->hd", probabilities, vals)
        pooled[row] = (
            np.einsum("hd,hdf->f", heads, weights["attention/attention_output/kernel"])
            + weights["attention/attention_output/bias"]
        )
    return pooled


def random_inputs(rng, batch=4, length=7, features=6):
    values = rng.standard_normal((batch, length, features)).astype("float32")
    lengths = np.array([length, 3, 1, 0])[:batch]
    return values, np.arange(length)[None, :] < lengths[:, None]


def built_layer(features=6, seed=0, max_documents=None):
    layer = AttentionPooling(num_heads=2, key_dim=3, max_documents=max_documents)
    layer.build((None, None, features))
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.standard_normal(w.shape).astype("float32") * 0.5 for w in layer.weights])  # biases too
    return layer


def test_matches_numpy_over_real_positions():
    values, mask = random_inputs(np.random.default_rng(0))
    layer = built_layer()
    got = keras.ops.convert_to_numpy(layer(values, mask=mask))
    np.testing.assert_allclose(got, numpy_attention_pooling(layer, values, mask), atol=1e-5)


def test_fully_padded_row_pools_to_zeros_and_padding_never_leaks():
    values, mask = random_inputs(np.random.default_rng(1))
    layer = built_layer(seed=1)  # non-zero output bias: a masked row must still be zeros
    got = keras.ops.convert_to_numpy(layer(values, mask=mask))
    np.testing.assert_array_equal(got[3], 0.0)
    polluted = np.where(mask[..., None], values, 1e4).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(polluted, mask=mask)), got, atol=1e-6)


def test_without_mask_every_position_counts():
    values, _ = random_inputs(np.random.default_rng(2))
    layer = built_layer(seed=2)
    everywhere = np.ones(values.shape[:2], bool)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(values)), numpy_attention_pooling(layer, values, everywhere), atol=1e-5
    )


def test_keras_mask_from_embedding_is_used():
    token_ids = np.array([[5, 3, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]])
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 6, mask_zero=True)(tokens)
    pooling = AttentionPooling(num_heads=2, key_dim=3)
    model = keras.Model(tokens, [pooling(embedded), embedded])
    pooled, vectors = (keras.ops.convert_to_numpy(t) for t in model(token_ids))
    np.testing.assert_allclose(pooled, numpy_attention_pooling(pooling, vectors, token_ids != 0), atol=1e-5)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_heads"):
        AttentionPooling(num_heads=0, key_dim=4)
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3\)"):
        AttentionPooling(2, 4)(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"mask.shape=\(2, 4\)"):
        AttentionPooling(2, 4)(np.zeros((2, 3, 8), "float32"), mask=np.ones((2, 4), bool))


def test_layer_contract():
    rng = np.random.default_rng(14)
    run_layer_test(
        AttentionPooling,
        dict(num_heads=2, key_dim=4),
        rng.standard_normal((2, 5, 6)).astype("float32"),
        expected_num_trainable_weights=9,
    )


def random_packed_rows(rng):
    return packed_rows(rng, lengths=((3, 1, 2), (6,), (), (2, 2)), row_length=7, features=6)


def test_each_document_of_a_packed_row_pools_as_it_does_alone():
    values, segment_ids, documents = random_packed_rows(np.random.default_rng(30))
    layer = built_layer(seed=3, max_documents=3)  # non-zero output bias: empty slots must still be zeros
    pooled = keras.ops.convert_to_numpy(layer(values, segment_ids=segment_ids))
    assert pooled.shape == (4, 3, 6)
    expected = np.zeros((4, 3, 6))
    for row, segment, document in documents:
        expected[row, segment - 1] = numpy_attention_pooling(layer, document[None], np.ones((1, len(document))))[0]
        alone = keras.ops.convert_to_numpy(layer(document[None]))[0]
        np.testing.assert_allclose(pooled[row, segment - 1], alone, atol=1e-5)
    np.testing.assert_allclose(pooled, expected, atol=1e-5)


def test_per_document_pooling_honours_the_mask_and_padding_never_leaks():
    values, segment_ids, _ = random_packed_rows(np.random.default_rng(31))
    mask = np.random.default_rng(32).random(segment_ids.shape) < 0.7
    layer = built_layer(seed=4, max_documents=3)
    got = keras.ops.convert_to_numpy(layer(values, mask=mask, segment_ids=segment_ids))
    masked_ids = np.where(mask, segment_ids, 0)
    for document in range(1, 4):
        np.testing.assert_allclose(
            got[:, document - 1], numpy_attention_pooling(layer, values, masked_ids == document), atol=1e-5
        )
    polluted = np.where(masked_ids[..., None] > 0, values, 1e4).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(polluted, mask=mask, segment_ids=segment_ids)), got, atol=1e-5
    )


def test_per_document_pooling_serializes_and_compiles():
    values, segment_ids, _ = random_packed_rows(np.random.default_rng(33))

    def factory():
        vectors, ids = keras.Input((7, 6)), keras.Input((7,), dtype="int32")
        pooled = AttentionPooling(num_heads=2, key_dim=3, max_documents=3)(vectors, segment_ids=ids)
        assert tuple(pooled.shape) == (None, 3, 6)
        return keras.Model([vectors, ids], pooled)

    layer_checks.assert_serialization_round_trip(factory, [values, segment_ids])
    layer_checks.assert_jit_matches_eager(factory(), [values, segment_ids])


def test_segment_ids_need_max_documents():
    values, segment_ids, _ = random_packed_rows(np.random.default_rng(34))
    with pytest.raises(ValueError, match=r"needs `max_documents`.*Received: max_documents=None"):
        AttentionPooling(2, 3)(values, segment_ids=segment_ids)
    with pytest.raises(ValueError, match=r"`segment_ids` must hold whole-number ids in \[0, max_documents \+ 1=3\)"):
        AttentionPooling(2, 3, max_documents=2)(values, segment_ids=segment_ids)
