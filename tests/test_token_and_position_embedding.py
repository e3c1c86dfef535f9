import keras
import numpy as np
import pytest

from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerEncoder
from tests import layer_checks
from tests import reference
from tests.layer_checks import run_layer_test

TOKEN_IDS = np.array([[5, 9, 2, 0, 0], [7, 1, 3, 8, 4], [6, 0, 0, 0, 0]], "int32")


def numpy_embedding(layer, token_ids, start_index=0):
    """Float64 token rows (scaled) plus the rows of positions start_index.. (learned or sinusoidal)."""
    tokens = np.asarray(layer.token_embedding.embeddings, np.float64)[token_ids]
    if layer.scale_embeddings:
        tokens = tokens * np.sqrt(layer.embedding_dim)
    length = token_ids.shape[1]
    if layer.position_encoding == "learned":
        table = np.asarray(layer.position_embedding.position_embeddings, np.float64)
    else:
        table = reference.sinusoidal_encoding(start_index + length, layer.embedding_dim)
    return tokens + table[start_index : start_index + length]


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
@pytest.mark.parametrize("scale_embeddings", [False, True])
@pytest.mark.parametrize("start_index", [0, 4])
def test_matches_numpy(position_encoding, scale_embeddings, start_index):
    layer = TokenAndPositionEmbedding(10, 16, 6, position_encoding=position_encoding, scale_embeddings=scale_embeddings)
    got = keras.ops.convert_to_numpy(layer(TOKEN_IDS, start_index=start_index))
    np.testing.assert_allclose(got, numpy_embedding(layer, TOKEN_IDS, start_index), atol=1e-6)


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_step_by_step_equals_whole_sequence(position_encoding):
    layer = TokenAndPositionEmbedding(10, 8, 6, position_encoding=position_encoding)
    whole = keras.ops.convert_to_numpy(layer(TOKEN_IDS))
    for t in range(TOKEN_IDS.shape[1]):
        step = keras.ops.convert_to_numpy(layer(TOKEN_IDS[:, t : t + 1], start_index=t))
        np.testing.assert_allclose(step[:, 0], whole[:, t], atol=1e-6)


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_mask_is_ids_not_zero_and_propagates(position_encoding):
    layer = TokenAndPositionEmbedding(10, 8, 4, position_encoding=position_encoding)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(TOKEN_IDS)._keras_mask), TOKEN_IDS != 0)
    ids = keras.Input((None,), dtype="int32")
    embedded = layer(ids)
    pooled = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(embedded))
    vectors = keras.Model(ids, embedded)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(pooled(TOKEN_IDS))[2],
        keras.ops.convert_to_numpy(vectors(TOKEN_IDS))[2, 0],
        atol=1e-6,
    )
    unmasked = TokenAndPositionEmbedding(10, 8, 4, mask_zero=False)
    assert unmasked.compute_mask(TOKEN_IDS) is None


def test_token_embedding_is_a_keras_embedding_for_weight_tying():
    layer = TokenAndPositionEmbedding(10, 8, 4)
    layer(TOKEN_IDS)
    assert isinstance(layer.token_embedding, keras.layers.Embedding)
    assert tuple(layer.token_embedding.embeddings.shape) == (10, 4)
    logits = keras.ops.matmul(layer(TOKEN_IDS), keras.ops.transpose(layer.token_embedding.embeddings))
    assert logits.shape == (3, 5, 10)


def test_learned_positions_past_maximum_name_both_numbers():
    with pytest.raises(ValueError, match="5 exceeds sequence_length=4"):
        TokenAndPositionEmbedding(10, 4, 6)(TOKEN_IDS)
    sinusoidal = TokenAndPositionEmbedding(10, None, 6, position_encoding="sinusoidal")
    assert sinusoidal(np.ones((1, 700), "int32")).shape == (1, 700, 6)


def model_factory(position_encoding="learned"):
    def factory():
        ids = keras.Input((None,), dtype="int32")
        embedded = TokenAndPositionEmbedding(10, 8, 4, position_encoding=position_encoding, scale_embeddings=True)(ids)
        return keras.Model(ids, keras.layers.Dense(3)(embedded))

    return factory


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_serialization_mixed_precision_jit(position_encoding):
    layer_checks.assert_serialization_round_trip(model_factory(position_encoding), TOKEN_IDS)
    layer_checks.assert_mixed_precision_close(model_factory(position_encoding), TOKEN_IDS)
    layer_checks.assert_jit_matches_eager(model_factory(position_encoding)(), TOKEN_IDS)
    layer_checks.assert_config_round_trip(
        TokenAndPositionEmbedding(10, None, 4, mask_zero=False, position_encoding="sinusoidal")
    )


def test_gradients_and_fit():
    layer_checks.assert_gradients_match_finite_differences(model_factory(), TOKEN_IDS)
    layer_checks.assert_fit_one_step(model_factory()(), TOKEN_IDS, np.ones((3, 5, 3), "float32"))


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="vocabulary_size=0"):
        TokenAndPositionEmbedding(0, 8, 4)
    with pytest.raises(ValueError, match="sequence_length=None"):
        TokenAndPositionEmbedding(10, None, 4)
    with pytest.raises(ValueError, match="embedding_dim=2.5"):
        TokenAndPositionEmbedding(10, 8, 2.5)
    with pytest.raises(ValueError, match="position_encoding='rotary'"):
        TokenAndPositionEmbedding(10, 8, 4, position_encoding="rotary")
    with pytest.raises(ValueError, match=r"token_ids.shape=\(2, 3, 4\)"):
        TokenAndPositionEmbedding(10, 8, 4)(np.ones((2, 3, 4), "int32"))


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_padding_never_changes_real_outputs_of_a_following_encoder(position_encoding):
    """The same sentences padded to 5 or to 9 tokens give the same encoder outputs on real tokens."""
    ids = keras.Input((None,), dtype="int32")
    embedded = TokenAndPositionEmbedding(10, 16, 8, position_encoding=position_encoding)(ids)
    model = keras.Model(ids, TransformerEncoder(16, 2)(embedded))
    longer = np.pad(TOKEN_IDS, ((0, 0), (0, 4)))
    short, long = keras.ops.convert_to_numpy(model(TOKEN_IDS)), keras.ops.convert_to_numpy(model(longer))
    real = TOKEN_IDS != 0
    np.testing.assert_allclose(long[:, :5][real], short[real], atol=1e-5)


def test_layer_contract():
    ids = np.array([[3, 7, 1, 0, 0], [9, 2, 4, 5, 1]], "int32")
    run_layer_test(
        TokenAndPositionEmbedding,
        dict(vocabulary_size=10, sequence_length=6, embedding_dim=4),
        ids,
        expected_num_trainable_weights=2,
    )
