"""`models.token_masking.mask_tokens` against a NumPy reading of its output: which tokens were
chosen (never padding or OOV), what replaced them, the labels and weights, the rates within
statistical bounds on a large batch, and the same masks for the same seed."""

import numpy as np
import pytest
import tensorflow as tf

from models.token_masking import MASK_ID
from models.token_masking import mask_tokens
from models.vocabulary import FIRST_TOKEN_ID
from models.vocabulary import OOV_ID

VOCABULARY_SIZE = 1_000


def padded_reviews(rows=128, length=512, seed=0):
    """Token ids `(rows, length)`: words, about 5 % OOV, each row padded after a random length."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(FIRST_TOKEN_ID, VOCABULARY_SIZE, (rows, length))
    ids[rng.random((rows, length)) < 0.05] = OOV_ID
    lengths = rng.integers(1, length + 1, rows)
    ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return ids.astype("int32")


def masked(ids, seed=(3, 7), **options):
    inputs, labels, weights = mask_tokens(tf.constant(ids), tf.constant(seed), VOCABULARY_SIZE, **options)
    return inputs["token_ids"].numpy(), inputs["masked_positions"].numpy(), labels.numpy(), weights.numpy()


def chosen_mask(ids, positions, weights):
    """`(rows, length)` bool: the positions the output names as chosen (weight 1)."""
    chosen = np.zeros(ids.shape, bool)
    for row in range(len(ids)):
        chosen[row, positions[row][weights[row] == 1]] = True
    return chosen


def within(count, total, probability, sigmas=5):
    return abs(count - total * probability) <= sigmas * np.sqrt(total * probability * (1 - probability))


def test_chosen_tokens_labels_and_weights():
    ids = padded_reviews()
    corrupted, positions, labels, weights = masked(ids)
    chosen = chosen_mask(ids, positions, weights)
    counts = chosen.sum(axis=1)
    assert positions.shape == labels.shape == weights.shape == (len(ids), max(1, counts.max()))
    for row in range(len(ids)):
        count = counts[row]
        assert np.all(weights[row, :count] == 1) and np.all(weights[row, count:] == 0)  # chosen first, then fillers
        assert np.all(np.diff(positions[row, :count]) > 0)  # increasing: each position once
        np.testing.assert_array_equal(labels[row, :count], ids[row, positions[row, :count]])
        assert np.all(labels[row, count:] == 0) and np.all(positions[row, count:] == 0)
    assert np.all(ids[chosen] >= FIRST_TOKEN_ID)  # never padding, never OOV
    np.testing.assert_array_equal(corrupted[~chosen], ids[~chosen])  # the rest untouched


def test_rates_within_statistical_bounds():
    ids = padded_reviews()
    corrupted, positions, _, weights = masked(ids)
    chosen = chosen_mask(ids, positions, weights)
    words, picked = int(np.sum(ids >= FIRST_TOKEN_ID)), int(chosen.sum())
    assert within(picked, words, 0.15)
    original, replaced = ids[chosen], corrupted[chosen]
    masks = replaced == MASK_ID
    randoms = (replaced != MASK_ID) & (replaced != original)
    kept = replaced == original
    assert within(masks.sum(), picked, 0.8)
    # A random word equals the original with probability 1 / (words in the vocabulary).
    chance = 1 / (VOCABULARY_SIZE - FIRST_TOKEN_ID)
    assert within(randoms.sum(), picked, 0.1 * (1 - chance))
    assert within(kept.sum(), picked, 0.1 + 0.1 * chance)
    assert np.all((replaced[randoms] >= FIRST_TOKEN_ID) & (replaced[randoms] < VOCABULARY_SIZE))
    # Random words are spread over the vocabulary, not one id.
    assert len(np.unique(replaced[randoms])) > 0.5 * randoms.sum()


def test_same_seed_same_masks_other_seed_other_masks():
    ids = padded_reviews(rows=8, length=64)
    first, again, other = masked(ids, (1, 2)), masked(ids, (1, 2)), masked(ids, (1, 3))
    for got, want in zip(first, again):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(first[0], other[0])


def test_a_batch_without_words_has_one_empty_target_slot():
    ids = np.array([[OOV_ID, OOV_ID, 0], [0, 0, 0]], "int32")
    corrupted, positions, labels, weights = masked(ids)
    np.testing.assert_array_equal(corrupted, ids)
    assert positions.shape == (2, 1) and np.all(weights == 0) and np.all(labels == 0)


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.1])
def test_rate_outside_the_open_unit_interval_is_refused(rate):
    with pytest.raises(ValueError, match=f"rate={rate}"):
        masked(padded_reviews(rows=1, length=4), rate=rate)
