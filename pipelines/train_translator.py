"""Trains the Transformer translator on tab-separated sentence pairs and scores it on the test split.

    python -m pipelines.train_translator [--data ../shared/data/spa-eng/spa-eng.zip] [--attention dense|window|linear]
        [--source es --target en] [--smoke] [--mixed-precision float32] [--jit-compile]
        [--strategy {default,mirrored,multi_worker}] [--pack [--pack-length N]] [--output-dir runs/translator] ...

Data: `--data` is a UTF-8 file of tab-separated pairs or a zip holding one (first two columns,
language codes `--columns`, default `en,<the other language>`). The seeded train/validation/test
split is by source sentence (`--split-by source`: every pair of a source sentence falls in one
split, so no test source is seen in training and each test source keeps all its references;
`--split-by pair` is the old split over pairs). It is written to `<output-dir>/split.json` (method,
seed, the data file's SHA-256), the vocabularies to `<output-dir>/{source,target}_vocabulary.txt`;
both are reused when the command is rerun, which resumes training from the last finished epoch.

`--pack` trains on rows of `--pack-length` tokens (default two sequence lengths) each packing
several sentence pairs (`pipelines.translation_data.make_packed_dataset`): pair `i` of a row is
segment `i` of its encoder and decoder rows, attention and positions stay inside each pair, and
the loss averages over the same real target tokens, and batches hold little padding;
validation, test and decoding stay one sentence per row, and the saved model is the same.

Training: AdamW with warm-up and cosine decay over `--epochs` (7), label smoothing
`--label-smoothing` (0.1), in float32 by default: a CPU without bfloat16 matrix units (AMX) gains
nothing from `mixed_bfloat16`, whose casts then cost more than the narrower products save; on GPUs
and AMX CPUs `--mixed-precision mixed_bfloat16` may be the faster choice. The saved model is
float32 either way.

Scoring: the best checkpoint's test token accuracy (teacher forcing), then every distinct test
source translated greedily and by beam search (`--beam-size` 4, GNMT length penalty
`--length-penalty` 0.6: the headline), each scored with sacrebleu BLEU and chrF against all of the
source's references and per pair (single reference; `pipelines.translation_scores`).
`<output-dir>/summary.json` holds the data counts, the split, model, time, figures and example
translations; `--attention` picks the encoder and decoder self-attention
(`models.translator_self_attention`: dense, window of `--attention-window` tokens, or linear; it is
part of the model's config). `translator.keras` and `run_config.json` are what `pipelines.translate`
and `python -m export.translator` read. `--evaluate-only` re-scores a finished run (writes
`evaluation_beam<K>.json`). Training also writes `<output-dir>/report.html`
(`pipelines.translator_report`): the figures, curves and the cross-attention alignments of the
example sentences, offline.

`--strategy multi_worker` trains on every worker of the `TF_CONFIG` cluster with
`pipelines.distributed` (run the same command on each worker, or under `pipelines.launch`): each
worker takes its share of every token-budgeted batch, each step's loss and token accuracy are
averaged over the real target tokens of the whole global batch, validation and test figures are
global, only the chief writes `<output-dir>` (and decodes for BLEU), and a rerun resumes from the
last checkpoint (every `--checkpoint-every` steps and every epoch).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from appkit.cli import fraction
from appkit.cli import non_negative_float
from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from appkit.files import write_json_atomic
from models import decoding_defaults
from models.decoding import decode_sentences
from models.decoding import make_decoder
from models.parallel_text import orient_pairs
from models.parallel_text import read_pairs
from models.translation_text import VOCABULARY_FILES
from models.translation_text import TranslationVectorizers
from models.translation_text import detokenize
from models.translator import TokenAccuracy
from models.translator import TranslatorConfig
from models.translator import build_translator
from models.translator import translation_loss
from models.translator_run import MODEL_FILE
from models.translator_run import RUN_CONFIG
from models.translator_run import SPLIT_FILE
from models.translator_run import load_run
from models.translator_run import read_split
from models.translator_run import write_split
from models.vocabulary import PADDING_ID
from pipelines import distributed
from pipelines import training
from pipelines import translation_data
from pipelines import translator_report
from pipelines.batching import with_counted_batches
from pipelines.translation_scores import ReferenceSet
from pipelines.translation_scores import translation_scores

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spa-eng" / "spa-eng.zip"
SMOKE_MODEL = TranslatorConfig(
    source_vocabulary_size=600,
    target_vocabulary_size=400,
    sequence_length=16,
    embedding_dim=32,
    intermediate_dim=64,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
)
SMOKE_DATA = {"max_pairs": 1_500, "max_test": 64}
# A --pack row's default length, in longest sentences: room for several short pairs at a quarter of the
# attention cost per token of rows four times as long.
PACKED_ROW_SENTENCES = 2
NUM_EXAMPLES = 8


def compile_translator(
    model,
    learning_rate,
    total_steps,
    warmup_fraction=0.05,
    weight_decay=0.01,
    jit_compile=False,
    label_smoothing=0.0,
):
    """AdamW with linear warm-up then cosine decay, the padding-aware (label-smoothed) loss and
    token accuracy."""
    model.compile(
        optimizer=training.adamw_with_warmup(learning_rate, total_steps, warmup_fraction, weight_decay),
        loss=translation_loss(label_smoothing),
        metrics=[TokenAccuracy()],
        jit_compile=jit_compile,
    )
    return model


PROG = "python -m pipelines.train_translator"


def parse_args(argv=None):
    """The flags, each checked against its range: a bad value exits 2 with one line, before any work."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="tab-separated pairs (.txt or .zip)")
    parser.add_argument("--columns", help="language codes of the two columns (default en,<other>)")
    parser.add_argument("--source", default="es", help="source language code")
    parser.add_argument("--target", default="en", help="target language code")
    parser.add_argument("--smoke", action="store_true", help="tiny model and ~1,500 pairs (tests)")
    training.add_training_arguments(
        parser,
        output_dir="runs/translator",
        epochs=7,
        learning_rate=1.5e-3,
        weight_decay=0.01,
        warmup_fraction=0.05,
        patience=3,
        jit_compile_help="XLA-compile training and decoding",
    )
    parser.add_argument(
        "--label-smoothing", type=fraction, default=0.1, help="share of the target put uniformly on the vocabulary"
    )
    parser.add_argument("--tokens-per-batch", type=positive_int, default=2048, help="padded source tokens per batch")
    parser.add_argument(
        "--pack",
        action="store_true",
        help="train on rows packing several sentence pairs each (attention kept inside each pair), not on padded batches",
    )
    parser.add_argument(
        "--pack-length",
        type=positive_int,
        help=f"tokens per packed row on each side (default {PACKED_ROW_SENTENCES} x the sequence length)",
    )
    parser.add_argument("--validation-fraction", type=fraction, default=0.05)
    parser.add_argument("--test-fraction", type=fraction, default=0.1)
    parser.add_argument("--max-pairs", type=positive_int, help="use only the first N pairs of the file")
    parser.add_argument("--max-test", type=positive_int, help="cap on test pairs scored with BLEU")
    parser.add_argument(
        "--split-by",
        choices=translation_data.SPLIT_METHODS,
        default="source",
        help="source: every pair of a source sentence in one split (default); pair: the old split over pairs",
    )
    parser.add_argument(
        "--beam-size",
        type=positive_int,
        default=decoding_defaults.BEAM_SIZE,
        help="the beam scored beside greedy decoding (1: greedy only); the headline BLEU is the beam's",
    )
    parser.add_argument(
        "--length-penalty",
        type=non_negative_float,
        default=decoding_defaults.LENGTH_PENALTY,
        help="beam search's GNMT length-normalisation exponent (0: raw log-probability)",
    )
    parser.add_argument(
        "--evaluate-only",
        action="store_true",
        help="score the finished run in --output-dir again (e.g. with --beam-size 4); no training",
    )
    training.add_config_arguments(parser, TranslatorConfig())
    return parser.parse_args(argv)


def model_config(args):
    """The default (or smoke) configuration, overridden by the model flags given."""
    return training.configured(SMOKE_MODEL if args.smoke else TranslatorConfig(), args)


def packed_row_length(pack_length, config):
    """The packed rows' length: `pack_length` (`--pack-length`), or `PACKED_ROW_SENTENCES` longest sentences."""
    return pack_length or PACKED_ROW_SENTENCES * config.sequence_length


def pair_columns(args):
    if args.columns:
        return tuple(code.strip() for code in args.columns.split(","))
    other = args.target if args.source == "en" else args.source
    return ("en", other)


def load_split_pairs(args, output_dir):
    """Reads the pairs, orients them, and makes (or reuses) the seeded split recorded in the run.

    Returns:
        `(pairs, method)`: `{split: (sources, targets)}` and the split's method ("source" or "pair").
    """
    sources, targets = orient_pairs(read_pairs(args.data), pair_columns(args), args.source, args.target)
    max_pairs = args.max_pairs or (SMOKE_DATA["max_pairs"] if args.smoke else None)
    if max_pairs:
        sources, targets = sources[:max_pairs], targets[:max_pairs]
    split_path = output_dir / SPLIT_FILE
    if split_path.is_file():
        split, method = read_split(split_path)
    else:
        method = args.split_by
        split = translation_data.split_pairs(sources, method, args.seed, args.validation_fraction, args.test_fraction)
        write_split(split_path, split, args.data, args.seed, method)
    pairs = {name: ([sources[i] for i in indices], [targets[i] for i in indices]) for name, indices in split.items()}
    return pairs, method


def split_summary(pairs, method, seed):
    """The split's method and seed, and how many distinct test sources training also saw."""
    training_sources = set(pairs["train"][0])
    return {
        "method": method,
        "seed": seed,
        "test_sources_in_training": sum(source in training_sources for source in set(pairs["test"][0])),
    }


def load_or_build_vectorizers(pairs, config, output_dir):
    if (output_dir / VOCABULARY_FILES["target"]).is_file():
        return TranslationVectorizers.load(output_dir, config.sequence_length)
    source_vocabulary, target_vocabulary = translation_data.build_vocabularies(
        *pairs["train"], config.source_vocabulary_size, config.target_vocabulary_size
    )
    vectorizers = TranslationVectorizers(source_vocabulary, target_vocabulary, config.sequence_length)
    vectorizers.save(output_dir)
    return vectorizers


def train(args):
    """Data -> vocabularies -> fit -> best weights -> test token accuracy and BLEU; returns the summary.

    Under `--strategy multi_worker` every worker of the cluster runs it: the chief writes
    `--output-dir`, the others work in a temporary directory (removed at the end) and return
    the global test figures without decoding (no BLEU).
    """
    run_dir = Path(args.output_dir)
    if args.strategy != distributed.MULTI_WORKER:
        run_dir.mkdir(parents=True, exist_ok=True)
        return _train(args, run_dir)
    with distributed.worker_directory(run_dir) as output_dir:
        return _train(args, output_dir)


def _train(args, output_dir):
    multi_worker = args.strategy == distributed.MULTI_WORKER
    if args.strategy == "mirrored":
        training.split_cpu(2)
    policy, strategy = training.set_up(args)
    if args.jit_compile and args.strategy == "mirrored" and not tf.config.list_logical_devices("GPU"):
        raise ValueError(
            "XLA cannot run a MirroredStrategy over logical CPU devices (a variable lives on another "
            "device): use --jit-compile or --strategy mirrored on CPU, not both. Received: "
            f"jit_compile={args.jit_compile}, strategy={args.strategy!r}"
        )
    config = model_config(args)

    pairs, split_method = load_split_pairs(args, output_dir)
    vectorizers = load_or_build_vectorizers(pairs, config, output_dir)
    if multi_worker:
        check_workers_agree(strategy, pairs, vectorizers)
    config = dataclasses.replace(
        config,
        source_vocabulary_size=vectorizers.source_vocabulary_size,
        target_vocabulary_size=vectorizers.target_vocabulary_size,
    )

    def batches(name, seed=args.seed, **options):
        return translation_data.make_dataset(
            vectorizers, *pairs[name], tokens_per_batch=args.tokens_per_batch, seed=seed, **options
        )

    def training_batches(seed):
        return translation_data.layout_batches(
            "packed" if args.pack else "bucketed",
            vectorizers,
            *pairs["train"],
            tokens_per_batch=args.tokens_per_batch,
            row_length=packed_row_length(args.pack_length, config),
            shuffle=True,
            seed=seed,
        )

    # Counted once: Keras shows the steps from the first epoch and warns of no "ran out of data".
    # Validation and test batches stay unpacked: their figures compare with an unpacked run's.
    validation_batches = with_counted_batches(batches("validation"))
    test_batches = with_counted_batches(batches("test", drop_long=False))
    train_batches = with_counted_batches(training_batches(args.seed))
    total_steps = args.epochs * int(train_batches.cardinality())

    with strategy.scope():
        model = build_translator(config)
        compile_translator(
            model,
            args.learning_rate,
            total_steps,
            args.warmup_fraction,
            args.weight_decay,
            args.jit_compile,
            args.label_smoothing,
        )
    started = time.perf_counter()
    fitted = training.fit(
        args,
        strategy,
        policy,
        model,
        total_steps,
        train_batches,
        validation_batches,
        monitor="val_token_accuracy",
        mode="max",
        losses=translation_loss(args.label_smoothing),
        metrics={"token_accuracy": distributed.token_accuracy()},
        epoch_batches=lambda epoch: training_batches(args.seed + epoch),
        counted=distributed.real_tokens(PADDING_ID),
    )
    training_seconds = time.perf_counter() - started

    if fitted.distributed_trainer is not None:  # global: every worker scores its share
        test = fitted.distributed_trainer.evaluate(test_batches)
    other_worker = output_dir != Path(args.output_dir)  # a multi-worker run's non-chief: the chief writes
    if not other_worker:
        model = scoring_translator(model, config, args.learning_rate, total_steps)
    if fitted.distributed_trainer is None:
        test = model.evaluate(test_batches, return_dict=True, verbose=0)
    epochs = fitted.history
    summary = {
        "data": {
            "path": str(args.data),
            "source": args.source,
            "target": args.target,
            **{name: len(sources) for name, (sources, _) in pairs.items()},
        },
        "split": split_summary(pairs, split_method, args.seed),
        "model": config.to_dict(),
        "parameters": model.count_params(),
        **training.run_summary(args, policy, strategy, fitted),
        "tokens_per_batch": args.tokens_per_batch,
        "packed_row_length": packed_row_length(args.pack_length, config) if args.pack else None,
        "training_seconds": round(training_seconds, 1),
        "training_seconds_all_epochs": round(sum(row.get("epoch_seconds", 0.0) for row in epochs), 1),
        "cpu_count": os.cpu_count(),
        "test_token_accuracy": test["token_accuracy"],
        "test_loss": test["loss"],
    }
    if other_worker:
        return summary
    model.save(output_dir / MODEL_FILE)
    write_json_atomic(
        output_dir / RUN_CONFIG,
        {
            "source": args.source,
            "target": args.target,
            "columns": list(pair_columns(args)),
            "data": str(args.data),
            "model": config.to_dict(),
        },
    )
    summary.update(evaluate_translations(model, vectorizers, ReferenceSet.from_pairs(*pairs["test"]), args))
    write_json_atomic(output_dir / "summary.json", summary)
    translator_report.write_report(output_dir / "report.html", summary, epochs, model, vectorizers)
    return summary


def check_workers_agree(strategy, pairs, vectorizers):
    """Raises unless every worker split the same sentences and built the same vocabularies.

    Each worker splits and adapts on its own (deterministic from the data and `--seed`); a chief
    that reuses a recorded split or vocabulary while another worker makes a fresh one (different
    flags, or an `--output-dir` the workers do not share) would otherwise train on mismatched ids.
    """
    digest = hashlib.sha256()
    for texts in [
        *(side for name in sorted(pairs) for side in pairs[name]),
        vectorizers.source_vocabulary,
        vectorizers.target_vocabulary,
    ]:
        digest.update("\n".join(texts).encode("utf-8") + b"\0")
    fingerprint = int.from_bytes(digest.digest()[:4], "big") % 2**30
    with distributed.collectives():
        agree = distributed.same_on_every_worker(strategy, fingerprint)
    if not agree:
        raise ValueError(
            "the workers split the data or built the vocabularies differently: run the same command "
            "on every worker, with an `--output-dir` they all see. Received: fingerprint "
            f"{fingerprint} of {sum(len(sources) for sources, _ in pairs.values())} pairs here"
        )


def scoring_translator(model, config, learning_rate, total_steps):
    """The trained weights in a plain float32 model, outside any distribution strategy: what is
    saved, scored and exported, whatever the training precision and strategy (mixed-precision
    variables are float32 already, so the copy is exact)."""
    training.set_precision("float32")
    scoring = build_translator(config)
    scoring.set_weights(model.get_weights())
    return compile_translator(scoring, learning_rate, total_steps)


def decode_and_score(model, vectorizers, test_set, beam_size, length_penalty, jit_compile):
    """`(scores, translations)`: the test sources decoded (greedy for `beam_size` 1) and scored."""
    decoder = make_decoder(
        model, vectorizers, beam_size=beam_size, length_penalty=length_penalty, jit_compile=jit_compile
    )
    started = time.perf_counter()
    translations = detokenize(decode_sentences(decoder, vectorizers, test_set.sources))
    decoding_seconds = time.perf_counter() - started
    scores = translation_scores(translations, test_set)
    return {**scores, "decoding_seconds": round(decoding_seconds, 1)}, translations


def evaluate_translations(model, vectorizers, test_set, args):
    """Greedy and beam-search (`--beam-size`, unless 1) BLEU and chrF of the test sources.

    Each is scored against all references of a source and per pair (`pipelines.translation_scores`).
    The headline `test_bleu` and the examples are the beam's (greedy's with `--beam-size 1`).
    """
    test_set = test_set.subset(args.max_test or (SMOKE_DATA["max_test"] if args.smoke else None))
    searches = {"greedy": (1, 0.0)}
    if args.beam_size > 1:
        searches["beam"] = (args.beam_size, args.length_penalty)
    results, translations = {}, {}
    for name, (beam_size, length_penalty) in searches.items():
        scores, translations[name] = decode_and_score(
            model, vectorizers, test_set, beam_size, length_penalty, args.jit_compile
        )
        signatures = {key: scores.pop(key) for key in ("bleu_signature", "chrf_signature")}
        results[name] = {"beam_size": beam_size, "length_penalty": length_penalty, **scores}
    best = "beam" if args.beam_size > 1 else "greedy"
    headline = results[best]
    return {
        **results,
        **signatures,
        "test_bleu": headline["bleu"],
        "test_chrf": headline["chrf"],
        "beam_size": args.beam_size,
        "length_penalty": headline["length_penalty"],
        "bleu_sentences": len(test_set.sources),
        "test_set": test_set.description(),
        "examples": [
            {"source": source, "reference": references[0], "translation": translation}
            for source, references, translation in _spread(
                list(zip(test_set.sources, test_set.references, translations[best]))
            )
        ],
    }


def _spread(items, count=NUM_EXAMPLES):
    """`count` evenly spaced items (short to long sentences)."""
    return [items[i] for i in np.linspace(0, len(items) - 1, min(count, len(items))).astype(int)]


def evaluate_run(args):
    """Scores a finished run's saved model on its recorded test split; writes evaluation_beam<K>.json."""

    output_dir = Path(args.output_dir)
    model, vectorizers, run_config = load_run(output_dir)
    # The run's own data file and direction: its split.json indexes those pairs, not the flags'.
    recorded = {key: run_config[key] for key in ("data", "source", "target")}
    args = argparse.Namespace(**{**vars(args), **recorded, "columns": ",".join(run_config["columns"])})
    pairs, _ = load_split_pairs(args, output_dir)
    summary = evaluate_translations(model, vectorizers, ReferenceSet.from_pairs(*pairs["test"]), args)
    write_json_atomic(output_dir / f"evaluation_beam{args.beam_size}.json", summary)
    return summary


def packing_benchmark_layouts(
    examples=512, tokens_per_batch=2048, smoke=False, seed=0, data=DEFAULT_DATA, layouts=translation_data.LAYOUTS
):
    """The translator's case of `benchmarks.packed_training`: one training step on the same pairs in each layout.

    `examples` pairs drawn (seeded) from the whole of `data` (the file is sorted by length), the
    vocabularies adapted on them, and the default model (`SMOKE_MODEL` with `smoke`), compiled as
    training compiles it (`compile_translator`, label smoothing 0.1, no XLA: batch shapes vary).

    Returns:
        `{layout: (model, batches, token_slots, real_tokens)}` for each of `layouts`
        (`translation_data.LAYOUTS`): a fresh compiled model, the list of its `(inputs, target_out)`
        batches, and how many source and target-input token slots and real (non-padding) tokens
        those batches hold; packed rows are `PACKED_ROW_SENTENCES` sequence lengths long.
    """
    config = SMOKE_MODEL if smoke else TranslatorConfig()
    sources, targets = orient_pairs(read_pairs(data), ("en", "es"), "es", "en")
    chosen = np.random.default_rng(seed).choice(len(sources), size=examples, replace=False)
    sources, targets = [sources[i] for i in chosen], [targets[i] for i in chosen]
    vocabularies = translation_data.build_vocabularies(
        sources, targets, config.source_vocabulary_size, config.target_vocabulary_size
    )
    vectorizers = TranslationVectorizers(*vocabularies, config.sequence_length)
    config = dataclasses.replace(
        config,
        source_vocabulary_size=vectorizers.source_vocabulary_size,
        target_vocabulary_size=vectorizers.target_vocabulary_size,
    )
    runs = {}
    for layout in layouts:
        batches = list(
            translation_data.layout_batches(
                layout, vectorizers, sources, targets, tokens_per_batch, packed_row_length(None, config)
            )
        )
        keras.utils.set_random_seed(seed)
        model = compile_translator(build_translator(config), 1e-3, len(batches), label_smoothing=0.1)
        tokens = [side for inputs, _ in batches for side in inputs[:2]]  # source, target_in
        runs[layout] = (
            model,
            batches,
            sum(int(np.prod(side.shape)) for side in tokens),
            sum(int(tf.math.count_nonzero(side)) for side in tokens),
        )
    return runs


def main(argv=None):
    args = parse_args(argv)
    with user_errors_exit(PROG, args.debug), distributed.exit_when_a_worker_is_lost():
        if not args.evaluate_only:
            require_writable_directory(args.output_dir, "--output-dir")
        summary = evaluate_run(args) if args.evaluate_only else train(args)
    print(json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False))
    return summary


if __name__ == "__main__":
    main()
