"""The pieces of `benchmarks/imdb_attention_families.py` whose mistakes would bias the table.

The length batches (every review exactly once, one padded length per batch); the budget's
learning-rate schedule. The end-to-end smoke run is in `tests/test_benchmarks.py`.
"""

import numpy as np

from benchmarks.imdb_attention_families import PAD_TO
from benchmarks.imdb_attention_families import CpuBudget
from benchmarks.imdb_attention_families import length_batches
from benchmarks.imdb_attention_families import padded_batch


def test_length_batches_hold_every_review_once_at_one_padded_length():
    lengths = np.random.default_rng(1).integers(0, 300, size=203)
    for rng in (None, np.random.default_rng(2)):
        batches = length_batches(lengths, 16, rng)
        assert sorted(np.concatenate(batches).tolist()) == list(range(203))
        for indices in batches:
            assert len(indices) <= 16
            assert len({-(-max(n, 1) // PAD_TO) for n in lengths[indices]}) == 1


def test_padded_batch_pads_with_zeros_to_a_multiple_of_the_bucket_width():
    ids = [np.array([5, 6, 7], np.int32), np.arange(2, 2 + PAD_TO + 1, dtype=np.int32)]
    batch = padded_batch(ids, [1, 0])
    assert batch.shape == (2, 2 * PAD_TO)
    np.testing.assert_array_equal(batch[1, :4], [5, 6, 7, 0])
    np.testing.assert_array_equal(batch[0, : PAD_TO + 1], ids[1])
    assert not batch[0, PAD_TO + 1 :].any() and not batch[1, 3:].any()


def test_the_learning_rate_warms_up_then_decays_to_zero_with_the_budget_used():
    budget = CpuBudget(100.0, 2e-3, warmup=0.1)
    rates = [budget.learning_rate(f) for f in np.linspace(0, 1, 101)]
    peak = int(np.argmax(rates))
    assert rates[0] < 1e-4 and abs(rates[peak] - 2e-3) < 1e-5 and 9 <= peak <= 11
    assert np.all(np.diff(rates[:peak]) > 0) and np.all(np.diff(rates[peak:]) <= 0)
    assert rates[-1] == 0.0 and budget.learning_rate(1.5) == 0.0
