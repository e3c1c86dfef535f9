"""HashedBigramEmbedding against a NumPy lookup of the same hashed pairs."""

import keras
import numpy as np
import pytest

from models.bigram_embedding import HashedBigramEmbedding
from tests import layer_checks
from tests.layer_checks import run_layer_test

VOCABULARY, BUCKETS, WIDTH = 40, 23, 6


def numpy_bigram_embeddings(ids, table, multiplier):
    """Oracle: row `(a * multiplier + b) mod buckets` of `table` where both tokens are real (>= 2)."""
    expected = np.zeros((*ids.shape, table.shape[1]))
    for row, sequence in enumerate(ids.astype(np.int64)):
        for position, (first, second) in enumerate(zip(sequence[:-1], sequence[1:])):
            if first >= 2 and second >= 2:
                expected[row, position] = table[(first * multiplier + second) % len(table)]
    return expected


def test_matches_the_numpy_lookup_with_zeros_for_padding_unknown_words_and_the_last_position():
    rng = np.random.default_rng(0)
    ids = layer_checks.padded_token_ids(rng, [9, 7, 3, 1, 0], 9, VOCABULARY)
    layer = HashedBigramEmbedding(BUCKETS, WIDTH)
    outputs = keras.ops.convert_to_numpy(layer(ids))
    table = keras.ops.convert_to_numpy(layer.embedding.embeddings)
    np.testing.assert_allclose(outputs, numpy_bigram_embeddings(ids, table, layer.multiplier), atol=1e-7)
    assert np.all(outputs[:, -1] == 0) and np.all(outputs[3:] == 0)  # one token or none: no pair


def test_layer_contract():
    ids = layer_checks.padded_token_ids(np.random.default_rng(1), [6, 4], 6, VOCABULARY)
    run_layer_test(
        HashedBigramEmbedding, dict(num_buckets=BUCKETS, output_dim=WIDTH), ids, expected_num_trainable_weights=1
    )


def test_bad_sizes_name_the_argument():
    with pytest.raises(ValueError, match="num_buckets"):
        HashedBigramEmbedding(0, WIDTH)
