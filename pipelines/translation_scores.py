"""BLEU and chrF of translations against every reference of each test source, and against one.

Tatoeba gives some sentences several translations. The test set is its distinct source
sentences, each with all of its references (`ReferenceSet.from_pairs`); each source is translated
once and scored two ways with sacrebleu (cased; BLEU with the 13a tokenisation):

- multi-reference: each translation against all references of its source (sacrebleu's
  reference streams; a source with fewer references leaves the later streams empty for it);
- single-reference: each test pair on its own, the translation of its source against that pair's
  reference (a source with three references counts three times): the figure of a split by pair.
"""

import dataclasses

import numpy as np
import sacrebleu


@dataclasses.dataclass(frozen=True)
class ReferenceSet:
    """Distinct source sentences (first-appearance order) and the references of each."""

    sources: list
    references: list

    @classmethod
    def from_pairs(cls, sources, references):
        grouped = {}
        for source, reference in zip(sources, references, strict=True):
            grouped.setdefault(source, []).append(reference)
        return cls(list(grouped), list(grouped.values()))

    def subset(self, count):
        """`count` evenly spaced sources (the pair files are sorted by length: every length stays)."""
        if count is None or count >= len(self.sources):
            return self
        chosen = np.linspace(0, len(self.sources) - 1, count).astype(int)
        return ReferenceSet([self.sources[i] for i in chosen], [self.references[i] for i in chosen])

    @property
    def num_pairs(self):
        return sum(len(references) for references in self.references)

    def description(self):
        counts = [len(references) for references in self.references]
        return {
            "sources": len(self.sources),
            "pairs": self.num_pairs,
            "sources_with_several_references": sum(count > 1 for count in counts),
            "most_references": max(counts, default=0),
        }


def _reference_streams(references):
    """sacrebleu's layout: stream k holds each source's k-th reference, or None where it has fewer."""
    depth = max(len(refs) for refs in references)
    return [[refs[k] if k < len(refs) else None for refs in references] for k in range(depth)]


def translation_scores(hypotheses, test_set):
    """BLEU and chrF of `hypotheses` (one per source of `test_set`), multi- and single-reference.

    Returns:
        A dict of the four scores (rounded to 2 decimals) and the two sacrebleu signatures.
    """
    if len(hypotheses) != len(test_set.sources):
        raise ValueError(
            f"`hypotheses` needs one translation per test source. Received: {len(hypotheses)} "
            f"translations for {len(test_set.sources)} sources"
        )
    pair_hypotheses = [h for h, refs in zip(hypotheses, test_set.references) for _ in refs]
    pair_references = [[reference for refs in test_set.references for reference in refs]]
    scores = {}
    for name, metric in (("bleu", sacrebleu.BLEU()), ("chrf", sacrebleu.CHRF())):
        multi = metric.corpus_score(hypotheses, _reference_streams(test_set.references))
        scores[f"{name}_signature"] = str(metric.get_signature())
        single = metric.corpus_score(pair_hypotheses, pair_references)
        scores[name] = round(multi.score, 2)
        scores[f"{name}_single_reference"] = round(single.score, 2)
    return scores
