"""WeightedNgramEmbedding against a NumPy set of each review's distinct unigrams and hashed bigrams."""

import keras
import numpy as np
import pytest

from models.ngram_bag import NgramBag
from models.weighted_ngram_embedding import WeightedNgramEmbedding
from tests import layer_checks
from tests.layer_checks import run_layer_test

VOCABULARY, BUCKETS, WIDTH = 30, 11, 4


def numpy_distinct_ngrams(sequence, multiplier):
    """Float64-side oracle: the sorted distinct feature ids of one review (real tokens only)."""
    features = {int(token) for token in sequence if token >= 2}
    for first, second in zip(sequence[:-1], sequence[1:]):
        if first >= 2 and second >= 2:
            features.add(VOCABULARY + (int(first) * multiplier + int(second)) % BUCKETS)
    return sorted(features)


def random_layer(seed=0):
    layer = WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)
    layer.build((None, None))
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.standard_normal(w.shape).astype("float32") for w in layer.weights])
    return layer


def test_each_distinct_ngram_is_one_weighted_slot():
    ids = layer_checks.padded_token_ids(np.random.default_rng(1), [9, 5, 1, 0], 9, VOCABULARY)
    ids[0, 3] = 1  # out of vocabulary: no unigram, no bigram on either side
    ids[1, 2:4] = ids[1, 0:2]  # a repeated unigram and bigram count once
    layer = random_layer()
    table, weights = (
        keras.ops.convert_to_numpy(w).astype(np.float64) for w in (layer.embeddings.embeddings, layer.feature_weights)
    )
    out, mask = (keras.ops.convert_to_numpy(t) for t in layer(ids))
    assert out.shape == (4, 17, WIDTH)
    for row, sequence in enumerate(ids):
        features = numpy_distinct_ngrams(sequence, layer.multiplier)
        np.testing.assert_allclose(out[row][mask[row]], weights[features, None] * table[features], atol=1e-5)
        np.testing.assert_array_equal(out[row][~mask[row]], 0.0)
    assert mask[1].sum() < 5 + 4  # the repeats were dropped
    assert not mask[3].any()


def test_features_are_indexed_as_the_ngram_bags():
    """A weight copied from an `NgramBag` of the same sizes lands on the same unigram and bigram."""
    ids = np.array([[5, 9, 0]], "int32")
    bag = NgramBag(VOCABULARY, BUCKETS)
    bigram = int(keras.ops.convert_to_numpy(bag.feature_ids(ids))[0, 3])  # unigrams 5, 9, 0, then the bigram (5, 9)
    layer = WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)
    layer.build((None, None))
    weights = np.zeros(VOCABULARY + BUCKETS, "float32")
    weights[bigram] = 1.0  # only the bigram
    layer.feature_weights.assign(weights)
    out = keras.ops.convert_to_numpy(layer(ids)[0])[0]
    nonzero = np.flatnonzero(np.abs(out).sum(axis=-1))
    assert len(nonzero) == 1
    np.testing.assert_allclose(
        out[nonzero[0]], keras.ops.convert_to_numpy(layer.embeddings.embeddings)[bigram], atol=1e-7
    )


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_buckets"):
        WeightedNgramEmbedding(VOCABULARY, 0, WIDTH)
    with pytest.raises(ValueError, match=r"token_ids.shape=\(3,\)"):
        WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)(np.zeros((3,), "int32"))
    with pytest.raises(ValueError, match=r"token_ids.*holding 30"):
        WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH)(np.array([[2, 30]], "int32"))


def test_a_bigram_vocabulary_copied_from_the_bag_finds_the_same_features():
    ids = layer_checks.padded_token_ids(np.random.default_rng(7), [9, 8, 6], 9, VOCABULARY)
    bag = NgramBag(VOCABULARY, BUCKETS, "naive_bayes", bigram_ids="vocabulary")
    bag.adapt(ids, labels=np.array([1, 0, 1]))
    layer = WeightedNgramEmbedding(VOCABULARY, BUCKETS, WIDTH, bigram_ids="vocabulary")
    layer.build((None, None))
    layer.bigram_vocabulary.assign(bag.bigram_vocabulary)
    layer.feature_weights.assign(bag.feature_weights)
    table = keras.ops.convert_to_numpy(layer.embeddings.embeddings).astype(np.float64)
    features, first = (keras.ops.convert_to_numpy(t) for t in bag.first_occurrences(ids))
    out, mask = (keras.ops.convert_to_numpy(t) for t in layer(ids))
    weights = bag.feature_weights.numpy().astype(np.float64)
    assert np.any(features[first] >= VOCABULARY)  # bigrams found in the vocabulary
    for row in range(len(ids)):
        counted = features[row][first[row]]  # the bag's distinct features of the review, sorted
        np.testing.assert_allclose(out[row][mask[row]], weights[counted, None] * table[counted], atol=1e-5)


@pytest.mark.parametrize("bigram_ids, weights", [("hashed", 1), ("vocabulary", 2)])
def test_layer_contract(bigram_ids, weights):
    ids = layer_checks.padded_token_ids(np.random.default_rng(2), [6, 4], 6, VOCABULARY)
    run_layer_test(
        WeightedNgramEmbedding,
        dict(vocabulary_size=VOCABULARY, num_buckets=BUCKETS, output_dim=WIDTH, bigram_ids=bigram_ids),
        ids,
        expected_num_trainable_weights=1,
        expected_num_non_trainable_weights=weights,
    )
