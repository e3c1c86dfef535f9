"""NgramBag against NumPy (int64, float64) TF-IDF and NBSVM weights of the same unigrams and hashed bigrams."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.ngram_bag import NgramBag
from models.sparse_linear import SparseLinear
from tests import layer_checks
from tests.layer_checks import run_layer_test

VOCABULARY, BUCKETS = 40, 23


def token_ids(rng, lengths, width=9):
    """Ids in [1, VOCABULARY) (1 = out-of-vocabulary appears too), 0-padded after each length."""
    return layer_checks.padded_token_ids(rng, lengths, width, VOCABULARY)


def numpy_features(ids, multiplier, vocabulary=VOCABULARY, buckets=BUCKETS):
    """Oracle: the set of feature ids of each document (unigrams, then hashed bigrams)."""
    documents = []
    for row in ids.astype(np.int64):
        features = {int(token) for token in row if token >= 2}
        for first, second in zip(row[:-1], row[1:]):
            if first >= 2 and second >= 2:
                features.add(vocabulary + int((first * multiplier + second) % buckets))
        documents.append(features)
    return documents


def document_frequency(documents):
    frequency = np.zeros(VOCABULARY + BUCKETS)
    for features in documents:
        frequency[list(features)] += 1
    return frequency


def numpy_weights(train_ids, labels, multiplier, weighting):
    """Oracle: scikit-learn's smooth binary idf, or NBSVM's log-count ratio (Wang & Manning, eq. 1-2)."""
    train = numpy_features(train_ids, multiplier)
    if weighting == "idf":
        return np.log((1 + len(train)) / (1 + document_frequency(train))) + 1
    p = 1 + document_frequency([features for features, label in zip(train, labels) if label == 1])
    q = 1 + document_frequency([features for features, label in zip(train, labels) if label == 0])
    return np.log((p / p.sum()) / (q / q.sum()))


def numpy_bag(weights, ids, multiplier, scale):
    expected = np.zeros((len(ids), VOCABULARY + BUCKETS))
    for row, features in enumerate(numpy_features(ids, multiplier)):
        expected[row, list(features)] = weights[list(features)]
        norm = np.linalg.norm(expected[row])
        expected[row] *= scale / norm if norm else 0.0
    return expected


@pytest.mark.parametrize("weighting", ["idf", "naive_bayes"])
@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_matches_numpy(scale, weighting):
    rng = np.random.default_rng(0)
    train_ids, ids = token_ids(rng, [9, 7, 3, 5, 0, 8]), token_ids(rng, [9, 4, 2, 1, 0])
    labels = np.array([1, 0, 0, 1, 1, 0])
    layer = NgramBag(VOCABULARY, BUCKETS, weighting, scale=scale)
    layer.adapt(train_ids, labels=labels, batch_size=4)  # two batches
    weights = numpy_weights(train_ids, labels, layer.multiplier, weighting)
    np.testing.assert_allclose(layer.feature_weights.numpy(), weights, rtol=1e-6)
    features, values = (keras.ops.convert_to_numpy(t) for t in layer(ids))
    assert features.shape == values.shape == (5, 17) and values.dtype == np.float32
    assert np.all(np.diff(features, axis=1) >= 0)  # sorted
    dense = np.zeros((5, VOCABULARY + BUCKETS))
    for row in range(5):
        np.add.at(dense[row], features[row], values[row])  # repeats carry 0
    np.testing.assert_allclose(dense, numpy_bag(weights, ids, layer.multiplier, scale), atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.densify(features, values)), dense, atol=1e-6)


@pytest.mark.parametrize("weighting", ["idf", "naive_bayes"])
def test_adapt_reads_datasets_of_labelled_batches_like_arrays(weighting):
    rng = np.random.default_rng(1)
    train_ids, labels = token_ids(rng, [9, 7, 3, 5, 0, 8]), np.array([0, 1, 1, 0, 1, 0])
    from_array, from_dataset = NgramBag(VOCABULARY, BUCKETS, weighting), NgramBag(VOCABULARY, BUCKETS, weighting)
    from_array.adapt(train_ids, labels=labels)
    from_dataset.adapt(tf.data.Dataset.from_tensor_slices((train_ids, labels)).batch(4))
    np.testing.assert_array_equal(from_array.feature_weights.numpy(), from_dataset.feature_weights.numpy())


def numpy_bigram_vocabulary(train_ids, size):
    """Oracle: {(a, b): index} of the `size` bigrams in most documents (ties: smaller a * VOCABULARY + b),
    indexed in ascending key order."""
    documents = {}
    for row in train_ids.astype(np.int64):
        for pair in {(int(a), int(b)) for a, b in zip(row[:-1], row[1:]) if a >= 2 and b >= 2}:
            documents[pair] = documents.get(pair, 0) + 1
    chosen = sorted(documents, key=lambda pair: (-documents[pair], pair[0] * VOCABULARY + pair[1]))[:size]
    return {pair: index for index, pair in enumerate(sorted(chosen, key=lambda pair: pair[0] * VOCABULARY + pair[1]))}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_bigram_vocabulary_gives_each_frequent_bigram_its_own_feature(jit_compile):
    rng = np.random.default_rng(5)
    train_ids = token_ids(rng, [9, 9, 8, 9, 7, 9, 9, 6], width=9)
    train_ids[:4, 2:5] = [11, 12, 13]  # (11, 12) and (12, 13) in 4 documents: surely chosen
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0])
    size = 6  # fewer than the distinct bigrams: the vocabulary is a choice
    layer = NgramBag(VOCABULARY, size, "naive_bayes", bigram_ids="vocabulary")
    layer.adapt(tf.data.Dataset.from_tensor_slices((train_ids, labels)).batch(3))  # three batches
    vocabulary = numpy_bigram_vocabulary(train_ids, size)
    assert len(vocabulary) == size and (11, 12) in vocabulary and (12, 13) in vocabulary
    np.testing.assert_array_equal(layer.bigram_vocabulary.numpy(), sorted(a * VOCABULARY + b for a, b in vocabulary))

    def features(row):  # each document's feature set under that vocabulary
        unigrams = {int(token) for token in row if token >= 2}
        pairs = {(int(a), int(b)) for a, b in zip(row[:-1], row[1:])}
        return unigrams | {VOCABULARY + vocabulary[pair] for pair in pairs if pair in vocabulary}

    frequency = {label: np.ones(VOCABULARY + size) for label in (0, 1)}
    for row, label in zip(train_ids, labels):
        frequency[label][list(features(row))] += 1
    p, q = frequency[1], frequency[0]
    np.testing.assert_allclose(layer.feature_weights.numpy(), np.log((p / p.sum()) / (q / q.sum())), rtol=1e-6)
    ids = np.concatenate([train_ids[:3], token_ids(rng, [9, 5])])  # two unseen documents
    found = tf.function(layer.feature_ids, jit_compile=jit_compile)(tf.constant(ids, tf.int32))
    for row, got in zip(ids, keras.ops.convert_to_numpy(found)):
        assert set(got[got >= 2].tolist()) == features(row)  # padding (0) and OOV (1) are no feature


def test_a_bigram_vocabulary_needs_int32_keys():
    with pytest.raises(ValueError, match="must be at most 46340. Received: vocabulary_size=46341"):
        NgramBag(46_341, 8, bigram_ids="vocabulary")
    NgramBag(46_340, 8, bigram_ids="vocabulary")


def test_idf_ignores_labels_of_any_kind():
    rng = np.random.default_rng(3)
    train_ids = token_ids(rng, [9, 7, 3, 5])
    without, with_classes = NgramBag(VOCABULARY, BUCKETS), NgramBag(VOCABULARY, BUCKETS)
    without.adapt(train_ids)
    with_classes.adapt(tf.data.Dataset.from_tensor_slices((train_ids, np.array([0, 3, 4, 2]))).batch(2))
    np.testing.assert_array_equal(without.feature_weights.numpy(), with_classes.feature_weights.numpy())


def test_naive_bayes_weights_point_to_the_label_a_feature_is_seen_with():
    layer = NgramBag(VOCABULARY, BUCKETS, "naive_bayes")
    layer.adapt(np.array([[5, 6, 9], [5, 6, 9], [7, 8, 9], [7, 8, 9]]), labels=np.array([1, 1, 0, 0]))
    weights = layer.feature_weights.numpy()
    assert weights[5] > 0 and weights[7] < 0 and abs(weights[9]) < 1e-6  # 9 is in every document


def test_bigram_hash_does_not_overflow_int32_at_the_largest_ids():
    layer = NgramBag(71_001, 2**18)
    ids = np.array([[71_000, 70_999, 1, 71_000, 2]], "int32")
    features = keras.ops.convert_to_numpy(layer.feature_ids(ids))[0]
    expected_bigram = 71_001 + (71_000 * layer.multiplier + 70_999) % 2**18
    assert features[5] == expected_bigram and features[5] < layer.num_features
    assert list(features[6:]) == [0, 0, 71_001 + (71_000 * layer.multiplier + 2) % 2**18]


def test_padding_and_out_of_vocabulary_tokens_are_not_features():
    layer = NgramBag(VOCABULARY, BUCKETS)
    features, values = (keras.ops.convert_to_numpy(t) for t in layer(np.array([[5, 1, 7, 0, 0]], "int32")))
    assert sorted(features[values != 0]) == [5, 7]  # no bigram: both touch the OOV id
    _, empty = layer(np.array([[0, 1, 0]], "int32"))
    assert np.all(keras.ops.convert_to_numpy(empty) == 0)  # no feature at all: zeros, not NaN


def test_serializes_with_its_weights_and_compiles():
    rng = np.random.default_rng(2)
    layer = NgramBag(VOCABULARY, BUCKETS, "naive_bayes", scale=3.0)
    layer.adapt(token_ids(rng, [9, 7, 3]), labels=np.array([1, 0, 1]))
    inputs = keras.Input((None,), dtype="int32")
    model = keras.Model(inputs, SparseLinear(layer.num_features)(layer(inputs)))
    ids = token_ids(rng, [9, 2, 0])
    layer_checks.assert_serialization_round_trip(model, ids)
    layer_checks.assert_jit_matches_eager(model, ids)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocabulary_size=0, num_buckets=8), "vocabulary_size=0"),
        (dict(vocabulary_size=8, num_buckets=2.5), "num_buckets=2.5"),
        (dict(vocabulary_size=8, num_buckets=8, scale=0.0), "scale=0.0"),
        (dict(vocabulary_size=8, num_buckets=8, weighting="tfidf"), "weighting='tfidf'"),
        (dict(vocabulary_size=8, num_buckets=8, bigram_ids="exact"), "bigram_ids='exact'"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NgramBag(**kwargs)


def test_bad_inputs_name_the_value():
    layer = NgramBag(VOCABULARY, BUCKETS)
    with pytest.raises(ValueError, match=r"token_ids.shape=\(2, 3, 4\)"):
        layer(np.zeros((2, 3, 4), "int32"))
    with pytest.raises(ValueError, match="no documents"):
        layer.adapt(np.zeros((0, 4), "int32"))


@pytest.mark.parametrize("bigram_ids", ["hashed", "vocabulary"])
def test_bad_labels_name_the_value_and_leave_the_weights_alone(bigram_ids):
    layer = NgramBag(VOCABULARY, BUCKETS, "naive_bayes", bigram_ids=bigram_ids)
    ids = np.array([[5, 6], [7, 8]])
    with pytest.raises(ValueError, match="Received: labels=None"):
        layer.adapt(ids)
    with pytest.raises(ValueError, match="Received: 3 labels for 2 documents"):
        layer.adapt(ids, labels=np.array([0, 1, 1]))
    with pytest.raises(ValueError, match=r"`labels` must be 0 or 1. Received: labels holding \[2\]"):
        layer.adapt(ids, labels=np.array([0, 2]))
    with pytest.raises(ValueError, match="Received: labels of 2 items and data=_BatchDataset"):
        layer.adapt(tf.data.Dataset.from_tensor_slices(ids).batch(2), labels=np.array([0, 1]))
    np.testing.assert_array_equal(layer.feature_weights.numpy(), np.ones(layer.num_features))
    if bigram_ids == "vocabulary":
        np.testing.assert_array_equal(layer.bigram_vocabulary.numpy(), np.iinfo(np.int32).max)


@pytest.mark.parametrize("bigram_ids, weights", [("hashed", 1), ("vocabulary", 2)])
def test_layer_contract(bigram_ids, weights):
    ids = np.array([[3, 7, 3, 7, 0], [9, 2, 4, 5, 1]], "int32")
    run_layer_test(
        NgramBag,
        dict(vocabulary_size=10, num_buckets=16, weighting="naive_bayes", bigram_ids=bigram_ids),
        ids,
        expected_num_trainable_weights=0,
        expected_num_non_trainable_weights=weights,
        run_training=False,
    )
