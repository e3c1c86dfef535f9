"""Multi- and single-reference BLEU and chrF (`pipelines.translation_scores`) against a float64
BLEU written from Papineni et al. (clipped n-gram counts over every reference, the brevity
penalty against the closest reference length) on sentences of words only, where sacrebleu's 13a
tokenisation is a whitespace split."""

import collections
import math

import pytest

from pipelines.translation_scores import ReferenceSet
from pipelines.translation_scores import translation_scores


def _ngrams(words, n):
    return collections.Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def reference_bleu(hypotheses, references):
    """Corpus BLEU-4 x 100, no smoothing (every order must match somewhere)."""
    matches, totals = [0] * 4, [0] * 4
    hypothesis_length = reference_length = 0
    for hypothesis, refs in zip(hypotheses, references):
        words, ref_words = hypothesis.split(), [ref.split() for ref in refs]
        hypothesis_length += len(words)
        reference_length += min((abs(len(r) - len(words)), len(r)) for r in ref_words)[1]
        for n in range(1, 5):
            counts = _ngrams(words, n)
            most = collections.Counter()
            for r in ref_words:
                most |= _ngrams(r, n)  # the largest count of each n-gram in any one reference
            matches[n - 1] += sum(min(count, most[gram]) for gram, count in counts.items())
            totals[n - 1] += max(len(words) - n + 1, 0)
    precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    brevity = min(0.0, 1.0 - reference_length / hypothesis_length)
    return 100.0 * math.exp(precision + brevity)


SOURCES = ["uno", "dos", "uno", "tres", "dos", "uno"]
REFERENCES = [
    "the cat sat on the mat today",
    "we went home after the long game",
    "a cat was sitting on the mat",
    "she reads a book in the garden",
    "we walked home after the game",
    "the cat is on the mat now",
]
HYPOTHESES = ["the cat sat on the mat now", "we went home after the game", "she reads the book in the garden"]


def test_the_test_set_groups_every_reference_of_a_source_in_first_appearance_order():
    test_set = ReferenceSet.from_pairs(SOURCES, REFERENCES)
    assert test_set.sources == ["uno", "dos", "tres"]
    assert test_set.references[0] == [REFERENCES[0], REFERENCES[2], REFERENCES[5]]
    assert test_set.references[1] == [REFERENCES[1], REFERENCES[4]]
    assert test_set.description() == {
        "sources": 3,
        "pairs": 6,
        "sources_with_several_references": 2,
        "most_references": 3,
    }
    assert test_set.subset(2).sources == ["uno", "tres"] and test_set.subset(None) is test_set


def test_multi_reference_scores_each_source_once_against_all_its_references():
    test_set = ReferenceSet.from_pairs(SOURCES, REFERENCES)
    scores = translation_scores(HYPOTHESES, test_set)
    assert scores["bleu"] == pytest.approx(reference_bleu(HYPOTHESES, test_set.references), abs=0.01)
    assert scores["bleu_signature"].startswith("nrefs:var")
    # Single reference: every pair on its own, the source's translation repeated per reference.
    pair_hypotheses = [HYPOTHESES[test_set.sources.index(source)] for source in SOURCES]
    expected_single = reference_bleu(pair_hypotheses, [[reference] for reference in REFERENCES])
    assert scores["bleu_single_reference"] == pytest.approx(expected_single, abs=0.01)
    assert scores["bleu"] > scores["bleu_single_reference"]


def test_a_translation_equal_to_any_one_reference_is_perfect_against_all():
    test_set = ReferenceSet.from_pairs(SOURCES, REFERENCES)
    exact = [REFERENCES[5], REFERENCES[4], REFERENCES[3]]  # each a later reference of its source
    scores = translation_scores(exact, test_set)
    assert scores["bleu"] == 100.0 and scores["chrf"] == 100.0
    assert scores["bleu_single_reference"] < 100.0 and scores["chrf_single_reference"] < 100.0


def test_one_translation_per_source_is_required():
    with pytest.raises(ValueError, match="2 translations for 3 sources"):
        translation_scores(HYPOTHESES[:2], ReferenceSet.from_pairs(SOURCES, REFERENCES))
