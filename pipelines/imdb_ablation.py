"""What was tried for the IMDB attention branch (#24), each row measured once on the 25,000 official test reviews.

One definition of these figures: the IMDB model card (`docs/models/imdb_classifier.md`) shows
`markdown_table()` (a test compares them) and `runs/imdb/report.html` shows `ROWS` under the run's own
figures (`pipelines.imdb_report`).
A new experiment is one more `AblationRow`, measured before it is written here.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class AblationRow:
    """One measured variant of the attention branch.

    Attributes:
        variant: what differs from the default, with the flags of `python -m pipelines.train_imdb`.
        attention_alone: test accuracy of the attention branch alone, as measured ("" if not).
        ensemble: test accuracy of the fitted ensemble, as measured ("" if not).
        note: where and how it was measured, and what it showed.
    """

    variant: str
    attention_alone: str
    ensemble: str
    note: str


ROWS = (
    AblationRow(
        "default: 1 `TransformerEncoder` block, width 64, first 512 tokens, 2 epochs; n-gram branch NB-LR "
        "(naive-Bayes weights, 2^20 bigram buckets)",
        "88.00 %",
        "91.30 %",
        "`make main`, seed 1337; the attention branch trains as in the next row, but the summed "
        "validation loss now keeps its epoch 1",
    ),
    AblationRow(
        "the attention branch on the review's distinct n-grams: each distinct unigram and hashed bigram (the "
        "n-gram branch's features, once each) embedded and scaled by its naive-Bayes ratio "
        "(`WeightedNgramEmbedding`), pooled by a learnt query (`AttentionPooling`): `--attention-inputs ngrams "
        "--embedding-dim 32 --dropout 0.5 --epochs 1`",
        "91.21 % ± 0.03 (3 seeds)",
        "91.26 % ± 0.08 (3 seeds)",
        "`pipelines.train_imdb`, seeds 1337-1339 (91.18 / 91.23 / 91.21 %; mean ± sample std); "
        "+3.38 over the default's attention branch over 3 seeds, and above its own run's n-gram branch (90.89 % "
        "± 0.04 after 1 epoch); 117-119 s of training; 37.4 M parameters against 3.5 M, so not the default. One "
        "epoch: a second overfits (scratch, seed 1337: 90.97 %, training accuracy 99.4 %). Scratch runs at 1 epoch, "
        "seed 1337: width 16 90.20 %, width 64 91.16 % (72.7 M parameters), dropout of whole n-grams 0.3 90.72 %, "
        "hashed trigrams too 91.25 % (twice the time); seed 1337: 8 heads 91.18 %, learning rate 3e-3 "
        "91.26 %, learning rate 3e-3 and 500 reviews held out instead of 2,500, 91.10 %: "
        "the single-seed differences are within a seed's noise",
    ),
    AblationRow(
        "+ a learnt bigram vocabulary instead of hash buckets, the most words it allows: `--vocabulary-size 46340 "
        "--bigram-buckets 2097152 --bigram-ids vocabulary` (every bigram of the training reviews its own feature)",
        "91.39 % ± 0.14 (3 seeds)",
        "91.34 % ± 0.05 (3 seeds)",
        "`pipelines.train_imdb`, seeds 1337-1339 (91.51 / 91.42 / 91.24 %); +0.04 "
        "over the hashed row below, within the spread: seed 1337 alone met 91.5 %; n-gram branch 90.93 % ± 0.09 "
        "after its one epoch; 79.2 M parameters, 216-233 s of training",
    ),
    AblationRow(
        "+ a 50,000-word vocabulary and 2^21 bigram buckets for both branches (`--vocabulary-size 50000 "
        "--bigram-buckets 2097152`)",
        "91.35 % ± 0.09 (3 seeds)",
        "91.30 % ± 0.02 (3 seeds)",
        "`pipelines.train_imdb`, seeds 1337-1339 (91.34 / 91.44 / 91.26 %); +0.14 over the second row; "
        "75.2 M parameters, 231-264 s of training (the machine shared with scratch runs). Seed 1337: "
        "2^22 buckets (148.6 M parameters, 437 s) 91.24 %, no gain; learning rate 3e-3 and 1,000 reviews held out "
        "instead of 2,500, 91.32 % (ensemble 91.43 %). Scratch NB-LR (scikit-learn, C=100, all 25,000 training "
        "reviews, full test split) shows where these features top out: exact unigrams and bigrams of the 20,000 "
        "words 91.70 %, the same with bigrams hashed into 2^20 buckets 91.49 %; in 5-fold cross-validation on the "
        "training reviews (C=30 / C=10), trigrams -0.07 / +0.05, punctuation kept as tokens +0.02 / +0.15, "
        "naive-Bayes ratios cross-fitted over 5 folds instead of learnt from every training review -0.32 / -0.16 "
        "(2 of the 5 folds)",
    ),
    AblationRow(
        "the first version of that branch: one vector per position (its unigram and the hashed bigram it starts, "
        "each embedding scaled by its naive-Bayes ratio), so a repeated phrase weighs once per repeat; "
        "`--attention-inputs ngrams --embedding-dim 32 --dropout 0.5`, 2 epochs",
        "90.58 %",
        "91.30 %",
        "`pipelines.train_imdb`, seed 1337 (n-gram branch 91.33 %, ensemble weights 0.34 / 0.80); "
        "with `--epochs 1`, as the second row, 90.90 %: the distinct n-grams gain 0.28. "
        "Scratch runs before it (1 epoch; the first 2): mean pooling of the same embeddings 89.70 %, attention "
        "pooling 90.65 %, no naive-Bayes scaling 90.16 %, hashed trigrams too 90.92 % (twice the time), beside the "
        "token encoder 90.85 %",
    ),
    AblationRow(
        "the same with the TF-IDF n-gram branch of 2^18 bigram buckets (the default before NB-LR; the rows "
        "below add to it)",
        "87.84 %",
        "90.55 %",
        "`make main`, seed 1337 (three versions of the code gave the same figures)",
    ),
    AblationRow(
        "+ the first 1,024 tokens (`--sequence-length 1024`)",
        "88.08 %",
        "90.60 %",
        "+0.24 (spread over seeds 0.17); training 223.9 s against 185.7 s; training accuracy 93.7 % "
        "in epoch 2 against 89.9 % on validation",
    ),
    AblationRow(
        "+ width 128 (`--embedding-dim 128 --intermediate-dim 256`)",
        "88.04 %",
        "90.56 %",
        "+0.20; training 271.1 s; training accuracy 94.2 % in epoch 2 against 90.5 % on validation",
    ),
    AblationRow(
        "+ both, with hashed bigrams, `--dropout 0.5 --weight-decay 0.1` (the classifier 20.2 M parameters)",
        "88.16 %",
        "90.26 %",
        "the validation loss kept epoch 1 (training accuracy 96.8 % in epoch 2 against 90.8 % "
        "on validation); training 383.5 s: the gains do not add up",
    ),
    AblationRow(
        "+ hashed bigram embeddings (`--attention-bigram-buckets 131072`, `HashedBigramEmbedding`)",
        "88.46 %",
        "90.52 %",
        "training accuracy 97.8 % in epoch 2 against 90.7 % on validation: it memorises",
    ),
    AblationRow(
        "+ the same with `--dropout 0.5 --weight-decay 0.1`",
        "88.60 %",
        "90.36 %",
        "training accuracy 96.2 % in epoch 2 against 91.1 % on validation; +0.14",
    ),
    AblationRow(
        "whole reviews (up to 2,048 tokens) through seven families, 240 CPU-s each",
        "86.58-88.77 %",
        "",
        "`benchmarks/results/imdb_attention_families.json`; dense best; longer training overfits "
        "(86.14 % after 900 CPU-s, `benchmarks/results/imdb_attention_families_target.json`)",
    ),
    AblationRow(
        "an earlier default: bigram embedding bag beside the block, one mean of the logits",
        "",
        "89.34 %",
        "an earlier session",
    ),
    AblationRow(
        "+ masked-language-model pretraining of the encoder (`python -m pipelines.pretrain_imdb`, 2 epochs, "
        "29.5 min), then `--pretrained <it>`",
        "87.08 %",
        "90.40 %",
        "n-gram branch 90.28 %; 0.8 point below the TF-IDF row's 87.84 % (the same model from scratch)",
    ),
)

HEADER = ("attention branch", "attention alone", "ensemble", "note")


def cells(row):
    """The row's cells in `HEADER` order."""
    return (row.variant, row.attention_alone, row.ensemble, row.note)


def markdown_table(rows=ROWS):
    """The Markdown table of `rows` (the IMDB model card shows it)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"
