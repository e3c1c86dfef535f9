import keras
import numpy as np
import pytest

from keras_attn import MaskedGlobalPooling
from tests import layer_checks
from tests.layer_checks import run_layer_test
from tests.packed_rows import packed_rows


def numpy_pooling(values, mask, mode):
    """Float64 oracle: mean/max over the positions where `mask` is True, zeros when none is."""
    values = np.asarray(values, np.float64)
    pooled = np.zeros((values.shape[0], values.shape[2]))
    for row, (sequence, keep) in enumerate(zip(values, np.asarray(mask, bool))):
        if keep.any():
            real = sequence[keep]
            pooled[row] = real.mean(axis=0) if mode == "mean" else real.max(axis=0)
    return pooled


def random_inputs(rng, batch=4, length=7, features=5):
    values = rng.standard_normal((batch, length, features)).astype("float32") - 3.0  # mostly negative
    lengths = np.array([length, 3, 1, 0])[:batch]
    mask = np.arange(length)[None, :] < lengths[:, None]
    return values, mask


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_matches_numpy_over_real_positions(mode):
    values, mask = random_inputs(np.random.default_rng(0))
    got = keras.ops.convert_to_numpy(MaskedGlobalPooling(mode=mode)(values, mask=mask))
    np.testing.assert_allclose(got, numpy_pooling(values, mask, mode), atol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_fully_padded_sequence_pools_to_zeros(mode):
    values, _ = random_inputs(np.random.default_rng(1))
    mask = np.zeros(values.shape[:2], bool)
    got = keras.ops.convert_to_numpy(MaskedGlobalPooling(mode=mode)(values, mask=mask))
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got, 0.0)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_padding_values_never_leak(mode):
    values, mask = random_inputs(np.random.default_rng(2))
    polluted = np.where(mask[..., None], values, 1e6).astype("float32")
    layer = MaskedGlobalPooling(mode=mode)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer(polluted, mask=mask)),
        keras.ops.convert_to_numpy(layer(values, mask=mask)),
    )


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_keras_mask_from_embedding_is_used(mode):
    token_ids = np.array([[5, 3, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]])
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 3, mask_zero=True)(tokens)
    model = keras.Model(tokens, [MaskedGlobalPooling(mode=mode)(embedded), embedded])
    pooled, vectors = (keras.ops.convert_to_numpy(t) for t in model(token_ids))
    np.testing.assert_allclose(pooled, numpy_pooling(vectors, token_ids != 0, mode), atol=1e-6)


def test_without_mask_every_position_counts():
    values, _ = random_inputs(np.random.default_rng(3))
    got = keras.ops.convert_to_numpy(MaskedGlobalPooling(mode="mean")(values))
    np.testing.assert_allclose(got, values.astype(np.float64).mean(axis=1), atol=1e-6)


def test_output_has_no_mask_and_compute_dtype():
    values, mask = random_inputs(np.random.default_rng(4))
    layer = MaskedGlobalPooling(mode="mean", dtype="mixed_bfloat16")
    assert layer.compute_mask(values, mask) is None
    assert keras.backend.standardize_dtype(layer(values, mask=mask).dtype) == "bfloat16"


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_serialization_and_jit(mode):
    def factory():
        tokens = keras.Input((None,), dtype="int32")
        embedded = keras.layers.Embedding(20, 4, mask_zero=True)(tokens)
        return keras.Model(tokens, MaskedGlobalPooling(mode=mode)(embedded))

    token_ids = np.array([[4, 7, 9, 0, 0], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]], "int32")
    layer_checks.assert_serialization_round_trip(factory, token_ids)
    layer_checks.assert_jit_matches_eager(factory(), token_ids)


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_gradients_match_finite_differences(mode):
    values, mask = random_inputs(np.random.default_rng(5))
    layer_checks.assert_gradients_match_finite_differences(lambda: MaskedGlobalPooling(mode=mode), values, mask=mask)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="mode='median'"):
        MaskedGlobalPooling(mode="median")
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 3\)"):
        MaskedGlobalPooling()(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"mask.shape=\(2, 4\)"):
        MaskedGlobalPooling()(np.zeros((2, 3, 8), "float32"), mask=np.ones((2, 4), bool))


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_layer_contract(mode):
    rng = np.random.default_rng(14)
    run_layer_test(
        MaskedGlobalPooling,
        dict(mode=mode),
        rng.standard_normal((2, 5, 3)).astype("float32"),
        expected_num_trainable_weights=0,
        run_training=False,
    )


def packed_documents(rng):
    values, segment_ids, documents = packed_rows(rng, ((3, 1, 2), (5,), (), (2, 2, 2)), row_length=6, features=5)
    return values - 3.0, segment_ids, [(row, segment, document - 3.0) for row, segment, document in documents]


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_each_document_of_a_packed_row_pools_as_it_does_alone(mode):
    values, segment_ids, documents = packed_documents(np.random.default_rng(20))
    layer = MaskedGlobalPooling(mode=mode, max_documents=4)
    pooled = keras.ops.convert_to_numpy(layer(values, segment_ids=segment_ids))
    assert pooled.shape == (4, 4, 5)
    expected = np.zeros((4, 4, 5))
    for row, segment, document in documents:
        expected[row, segment - 1] = numpy_pooling(document[None], np.ones((1, len(document)), bool), mode)[0]
        alone = keras.ops.convert_to_numpy(MaskedGlobalPooling(mode=mode)(document[None]))[0]
        np.testing.assert_allclose(pooled[row, segment - 1], alone, atol=1e-6)
    np.testing.assert_allclose(pooled, expected, atol=1e-5)  # empty slots and the empty row are zeros


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_per_document_pooling_honours_the_mask_and_padding_never_leaks(mode):
    values, segment_ids, _ = packed_documents(np.random.default_rng(21))
    mask = np.random.default_rng(22).random(segment_ids.shape) < 0.7
    layer = MaskedGlobalPooling(mode=mode, max_documents=4)
    got = keras.ops.convert_to_numpy(layer(values, mask=mask, segment_ids=segment_ids))
    masked_ids = np.where(mask, segment_ids, 0)
    for document in range(1, 5):
        keep = masked_ids == document
        np.testing.assert_allclose(got[:, document - 1], numpy_pooling(values, keep, mode), atol=1e-5)
    polluted = np.where(masked_ids[..., None] > 0, values, np.nan).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(polluted, mask=mask, segment_ids=segment_ids)), got, atol=1e-6
    )


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_per_document_pooling_gradients_serialization_and_jit(mode):
    values, segment_ids, _ = packed_documents(np.random.default_rng(23))
    layer_checks.assert_gradients_match_finite_differences(
        lambda: MaskedGlobalPooling(mode=mode, max_documents=4), values, segment_ids=segment_ids
    )
    layer_checks.assert_jit_matches_eager(
        MaskedGlobalPooling(mode=mode, max_documents=4), values, segment_ids=segment_ids
    )

    def factory():
        vectors, ids = keras.Input((6, 5)), keras.Input((6,), dtype="int32")
        pooled = MaskedGlobalPooling(mode=mode, max_documents=4)(vectors, segment_ids=ids)
        assert tuple(pooled.shape) == (None, 4, 5)
        return keras.Model([vectors, ids], pooled)

    layer_checks.assert_serialization_round_trip(factory, [values, segment_ids])


def test_segment_ids_need_max_documents_and_ids_within_it():
    values, segment_ids, _ = packed_documents(np.random.default_rng(24))
    with pytest.raises(ValueError, match=r"needs `max_documents`.*Received: max_documents=None"):
        MaskedGlobalPooling()(values, segment_ids=segment_ids)
    with pytest.raises(ValueError, match=r"`segment_ids` must hold whole-number ids in \[0, max_documents \+ 1=3\)"):
        MaskedGlobalPooling(max_documents=2)(values, segment_ids=segment_ids)
    with pytest.raises(ValueError, match=r"`segment_ids` must be integer.*float32"):
        MaskedGlobalPooling(max_documents=4)(values, segment_ids=segment_ids.astype("float32"))
    with pytest.raises(ValueError, match=r"`max_documents` must be a positive integer.*max_documents=0"):
        MaskedGlobalPooling(max_documents=0)
