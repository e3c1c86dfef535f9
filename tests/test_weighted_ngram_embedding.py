"""WeightedNgramEmbedding against a NumPy lookup of the same unigrams, hashed bigrams and weights."""

import keras
import numpy as np
import pytest

from models.ngram_bag import NgramBag
from models.weighted_ngram_embedding import WeightedNgramEmbedding
from tests import layer_checks
from tests.layer_checks import run_layer_test

VOCABULARY, BUCKETS, WIDTH = 30, 11, 4


def numpy_weighted_ngrams(ids, unigrams, bigrams, weights, multiplier):
    """Float64 oracle: each position's weighted unigram plus the weighted bigram it starts (real tokens only)."""
    out = np.zeros((*ids.shape, unigrams.shape[1]))
    for row, sequence in enumerate(ids):
        for i, token in enumerate(sequence):
            if token >= 2:
                out[row, i] += weights[token] * unigrams[token]
            if i + 1 < len(sequence) and token >= 2 and sequence[i + 1] >= 2:
                bucket = (int(token) * multiplier + int(sequence[i + 1])) % BUCKETS
                out[row, i] += weights[VOCABULARY + bucket] * bigrams[bucket]
    return out


def random_layer(seed=0):
    layer = WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)
    layer.build((None, None))
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.standard_normal(w.shape).astype("float32") for w in layer.weights])
    return layer


def test_matches_numpy_with_oov_and_padding():
    ids = layer_checks.padded_token_ids(np.random.default_rng(1), [9, 5, 1, 0], 9, VOCABULARY)
    ids[0, 3] = 1  # out of vocabulary: no unigram, no bigram on either side
    layer = random_layer()
    unigrams, bigrams, weights = (keras.ops.convert_to_numpy(w).astype(np.float64) for w in (
        layer.unigrams.embeddings, layer.bigrams.embeddings, layer.feature_weights))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer(ids)), numpy_weighted_ngrams(ids, unigrams, bigrams, weights, layer.multiplier),
        atol=1e-5,
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.compute_mask(ids)), ids != 0)


def test_features_are_indexed_as_the_ngram_bags():
    """A weight copied from an `NgramBag` of the same sizes lands on the same unigram and bigram."""
    ids = np.array([[5, 9, 0]], "int32")
    bag = NgramBag(VOCABULARY, BUCKETS)
    features = keras.ops.convert_to_numpy(bag.feature_ids(ids))[0]  # unigrams 5, 9, 0, then the bigram (5, 9)
    layer = WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)
    layer.build((None, None))
    weights = np.zeros(VOCABULARY + BUCKETS, "float32")
    weights[features[3]] = 1.0  # only the bigram
    layer.feature_weights.assign(weights)
    out = keras.ops.convert_to_numpy(layer(ids))
    bucket = features[3] - VOCABULARY
    np.testing.assert_allclose(out[0, 0], keras.ops.convert_to_numpy(layer.bigrams.embeddings)[bucket], atol=1e-7)
    np.testing.assert_array_equal(out[0, 1:], 0.0)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_buckets"):
        WeightedNgramEmbedding(VOCABULARY, 0, WIDTH)
    with pytest.raises(ValueError, match=r"token_ids.shape=\(3,\)"):
        WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)(np.zeros((3,), "int32"))


def test_layer_contract():
    ids = layer_checks.padded_token_ids(np.random.default_rng(2), [6, 4], 6, VOCABULARY)
    run_layer_test(
        WeightedNgramEmbedding, dict(vocabulary_size=VOCABULARY, num_buckets=BUCKETS, output_dim=WIDTH), ids,
        expected_num_trainable_weights=2, expected_num_non_trainable_weights=1,
    )
