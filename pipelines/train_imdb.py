"""Trains the IMDB sentiment classifier from the raw reviews and writes a run summary.

    python -m pipelines.train_imdb [--data PATH] [--smoke] [--mixed-precision mixed_bfloat16]
        [--jit-compile] [--strategy {default,mirrored,multi_worker}] [--output-dir runs/imdb]
        [--pretrained {DIR,none}] [--pack] ...

Data: see `pipelines.imdb_data` (lookup order --data, $KERAS_ATTN_DATA / $IMDB_DATA_DIR,
../shared/data, TFDS). The vectoriser is adapted on the training split only (minus the held-out
validation slice) and its vocabulary written to `<output-dir>/vocabulary.txt`; the test split is
only used for the final evaluation. Rerunning the same command after an interruption resumes from
the last finished epoch. `<output-dir>/summary.json` holds data counts, parameters, epochs, time,
throughput and validation/test accuracy.

The attention branch starts from the encoder of `python -m pipelines.pretrain_imdb` (masked-
language-model pretraining on the same training reviews) when `--pretrained DIR` names one, or by
default when `runs/imdb_pretrain` (`imdb_pretrain/` beside `--output-dir`) holds a finished one;
otherwise from random weights, and one line says how to pretrain. Its configuration and
vocabulary must be this run's (`pipelines.encoder_checkpoint`); `summary.json` records
`pretrained` (its directory and epochs, or `null`). `--pretrained none` turns it off.

`--pack` trains the attention branch on each batch's reviews packed into rows of
`--sequence-length` tokens (`pipelines.batching.pack_documents`; attention, positions and bigrams
stay within each review, one vector pooled per review): the same examples and loss per batch as
padded, without the padding. The n-gram branch reads the reviews as before; evaluation, the
ensemble fit and the export use the padded classifier with the trained weights. One machine only.

`--strategy multi_worker` trains on every worker of the `TF_CONFIG` cluster with
`pipelines.distributed` (run the same command on each worker, or under `pipelines.launch`):
`--batch-size` is the global batch, validation and test accuracy are global, only the chief
writes `<output-dir>`, and a rerun resumes from the last checkpoint (every `--checkpoint-every`
steps and every epoch). `--jit-compile` XLA-compiles each worker's forward and backward pass;
`--mixed-precision mixed_float16` scales the loss (`keras.optimizers.LossScaleOptimizer`).
"""

import argparse
import dataclasses
import json
from pathlib import Path

import keras
import tensorflow as tf

from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from appkit.files import write_json_atomic
from models import imdb_text
from models.sentiment_classifier import BRANCHES
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import adapt_ngram_weights
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import fit_ensemble
from models.sentiment_classifier import load_encoder_weights
from models.sentiment_classifier import training_model
from pipelines import distributed
from pipelines import encoder_checkpoint
from pipelines import imdb_data
from pipelines import training
from pipelines.batching import with_counted_batches

SMOKE_MODEL = SentimentClassifierConfig(
    vocabulary_size=2_000,
    max_tokens=128,
    sequence_length=128,
    embedding_dim=16,
    num_layers=1,
    num_heads=2,
    intermediate_dim=32,
    bigram_buckets=1_024,
)
# The sum of the branch losses on the validation slice: the ensemble weights are only fitted
# after training, on that slice, so the ensemble's accuracy there cannot pick the epoch.
MONITOR, MONITOR_MODE = "val_loss", "min"
SMOKE_DATA = {"validation_size": 64, "max_train": 256, "max_test": 128}
VALIDATION_SIZE = 2_500  # training reviews held out for early stopping and the ensemble fit


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What a training run leaves for export: the classifier (and its multi-output training
    view, same weights), the vectoriser and the data."""

    model: keras.Model
    trainer: keras.Model
    vectorizer: keras.layers.TextVectorization
    config: SentimentClassifierConfig
    splits: imdb_data.ImdbSplits
    summary: dict
    output_dir: Path
    chief: bool = True  # False on the other workers of a multi-worker run: they write and export nothing


PROG = "python -m pipelines.train_imdb"


DESCRIPTION = __doc__.split("\n")[0]


def parse_args(argv=None, prog=PROG, parents=(), description=DESCRIPTION):
    """The flags, each checked against its range: a bad value exits 2 with one line, before any work.

    A command that trains the classifier and does more (the main job) passes its own flags as
    `parents` (argparse parsers made with `add_help=False`), so `--help` lists them all.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, parents=parents)
    add_data_arguments(parser)
    training.add_training_arguments(
        parser,
        output_dir="runs/imdb",
        epochs=2,
        learning_rate=2e-3,
        weight_decay=0.05,
        warmup_fraction=0.1,
        patience=2,
        jit_compile_help="XLA-compile the train/eval steps",
    )
    parser.add_argument(
        "--cpu-devices", type=positive_int, help="split the CPU into N logical devices (mirrored training without GPUs)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=32)
    add_pack_argument(parser)
    parser.add_argument("--max-test", type=positive_int, help="cap on test reviews")
    parser.add_argument(
        "--pretrained",
        help=f"encoder checkpoint of `{encoder_checkpoint.COMMAND}` for the attention branch (default: "
        f"{encoder_checkpoint.DEFAULT_DIRECTORY_NAME}/ beside --output-dir, when finished; "
        f"`{encoder_checkpoint.NONE}`: no pretraining)",
    )
    training.add_config_arguments(parser, SentimentClassifierConfig())
    args = parser.parse_args(argv)
    with user_errors_exit(prog, args.debug):
        model_config(args)  # the flags' combination (e.g. --sequence-length above --max-tokens)
        if args.pack and args.strategy == distributed.MULTI_WORKER:
            raise ValueError(f"`--pack` trains on one machine only. Received: --pack with --strategy={args.strategy}")
    # Resolved once, here: the main job's other seeds train in other output directories.
    args.pretrained = encoder_checkpoint.request(args.pretrained, args.output_dir)
    return args


def add_pack_argument(parser):
    """`--pack`: the attention branch reads the reviews of each batch packed into rows of
    `--sequence-length` tokens (`pipelines.batching.pack_documents`): the same examples and loss,
    without the padding; `pipelines.pretrain_imdb` takes it too."""
    parser.add_argument(
        "--pack",
        action="store_true",
        help="pack each batch's reviews into rows of --sequence-length tokens for the attention branch "
        "(attention within each review; same examples and loss, no padding)",
    )


def add_data_arguments(parser):
    """The flags that choose the reviews (`data_limits`): `--data`, `--cache-dir`, `--no-download`,
    `--smoke`, `--validation-size`, `--max-train`; `pipelines.pretrain_imdb` takes them too."""
    parser.add_argument("--data", help="IMDB archive or a directory holding it (see pipelines/imdb_data.py)")
    parser.add_argument("--cache-dir", help="decoded-data cache (default $KERAS_ATTN_CACHE or ~/.cache/keras_attn)")
    parser.add_argument("--no-download", action="store_true", help="never fall back to a TFDS download")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model and a few hundred reviews (tests); data and model flags given explicitly still win",
    )
    parser.add_argument(
        "--validation-size",
        type=positive_int,
        help=f"training reviews held out (default {VALIDATION_SIZE:,}; --smoke: 64)",
    )
    parser.add_argument("--max-train", type=positive_int, help="cap on training reviews")


def model_config(args):
    """The default (or smoke) configuration, overridden by the model flags given."""
    return training.configured(SMOKE_MODEL if args.smoke else SentimentClassifierConfig(), args)


def data_limits(args):
    """`split_reviews`'s limits from the flags: --smoke's or the defaults, explicit flags winning
    (a command without `--max-test` has none)."""
    limits = dict(SMOKE_DATA) if args.smoke else {"validation_size": VALIDATION_SIZE}
    for name in ("validation_size", "max_train", "max_test"):  # an explicit flag wins over --smoke
        if getattr(args, name, None) is not None:
            limits[name] = getattr(args, name)
    return limits


def review_vectorizer(splits, config, output_dir):
    """The vectoriser adapted on the training reviews of `splits`, its vocabulary written to
    `<output_dir>/vocabulary.txt`, and `config` with its vocabulary size: `(vectorizer, config, path)`."""
    vectorizer = imdb_text.adapt_review_vectorizer(splits.train.map(lambda text, label: text), config.vocabulary_size)
    vocabulary_path = imdb_text.save_review_vocabulary(vectorizer, output_dir / "vocabulary.txt")
    return vectorizer, dataclasses.replace(config, vocabulary_size=vectorizer.vocabulary_size()), vocabulary_path


def train(args):
    """Runs data -> vectoriser -> fit -> best weights -> evaluation; returns a `TrainingRun`."""
    # Only the chief writes the run's directory; other workers write into a temporary one.
    if args.strategy == distributed.MULTI_WORKER:
        output_dir = distributed.worker_output_dir(args.output_dir)
    else:
        output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    policy, strategy = training.set_up(args)
    config = model_config(args)

    pretrained = encoder_checkpoint.find(args.pretrained)
    cache = imdb_data.load_cache(args.data, args.cache_dir, allow_download=not args.no_download)
    splits = imdb_data.split_reviews(cache, **data_limits(args))
    vectorizer, config, vocabulary_path = review_vectorizer(splits, config, output_dir)
    if pretrained is not None:  # before any training: a checkpoint that does not fit is an error now
        encoder_checkpoint.check_fits(pretrained, config, vectorizer.get_vocabulary(include_special_tokens=False))

    def batches(ids, **options):
        return imdb_data.batched(ids, args.batch_size, config.max_tokens, **options)

    def training_batches(ids, **options):  # what the trainer reads: packed rows beside the reviews under --pack
        if not args.pack:
            return batches(ids, **options)
        return imdb_data.padded(ids, args.batch_size, **options).map(
            lambda ids, label: ({"token_ids": ids, **imdb_data.packed(ids, config.sequence_length)}, label),
            num_parallel_calls=tf.data.AUTOTUNE,
        )

    def every_output(ids, label):
        return ids, {name: label for name in (*BRANCHES, "probability")}

    # Tokenised once and cached: the idf adaptation and every training epoch read the same ids.
    train_ids = imdb_data.token_ids(splits.train, vectorizer, config.max_tokens)
    train_batches = with_counted_batches(training_batches(train_ids, shuffle=True, seed=args.seed, drop_remainder=True))
    validation_ids, test_ids = (
        imdb_data.token_ids(split, vectorizer, config.max_tokens) for split in (splits.validation, splits.test)
    )
    # Counted once: Keras shows the steps from the first epoch and warns of no "ran out of data".
    validation_batches, test_batches = (with_counted_batches(batches(ids)) for ids in (validation_ids, test_ids))
    fit_validation_batches = with_counted_batches(training_batches(validation_ids)) if args.pack else validation_batches
    total_steps = args.epochs * int(train_batches.cardinality())

    with strategy.scope():
        model = build_sentiment_classifier(config)
        # Under --pack the branches train in a view reading packed rows, with the same layers' weights.
        fitted_model = build_sentiment_classifier(config, packed=True) if args.pack else model
        adapt_ngram_weights(fitted_model, batches(train_ids))  # feature weights from the training split only
        if pretrained is not None:  # a resumed run's backup then replaces every weight
            encoder_checkpoint.load_into(fitted_model, pretrained)
        model.compile(
            loss=keras.losses.BinaryCrossentropy(),
            metrics=[keras.metrics.BinaryAccuracy(name="accuracy")],
            jit_compile=args.jit_compile,
        )
        # Each branch learns from its own loss; the accuracy followed is the ensemble's.
        trainer = compiled_trainer(
            fitted_model,
            training.adamw_with_warmup(args.learning_rate, total_steps, args.warmup_fraction, args.weight_decay),
            args.jit_compile,
        )
    fitted = training.fit(
        args,
        strategy,
        policy,
        trainer,
        total_steps,
        train_batches.map(every_output),
        fit_validation_batches.map(every_output),
        monitor=MONITOR,
        mode=MONITOR_MODE,
        losses={branch: keras.losses.BinaryCrossentropy() for branch in BRANCHES},
        metrics={f"{name}_accuracy": distributed.accuracy(name) for name in (*BRANCHES, "probability")},
        epoch_batches=lambda epoch: training_batches(
            train_ids, shuffle=True, seed=args.seed + epoch, drop_remainder=True
        ).map(every_output),
    )
    if args.pack:  # the classifier read from here on is the padded one, with the weights trained
        load_encoder_weights(model, fitted_model)
        with strategy.scope():
            trainer = compiled_trainer(model, "adam", args.jit_compile)
    with strategy.scope():
        ensemble = fit_ensemble(model, validation_batches)
    if fitted.distributed_trainer is not None:  # global figures: every worker evaluates its share
        validation = {
            "accuracy": fitted.distributed_trainer.evaluate(validation_batches.map(every_output))[
                "probability_accuracy"
            ]
        }
        test = fitted.distributed_trainer.evaluate(test_batches.map(every_output))
    else:
        validation = model.evaluate(validation_batches, return_dict=True, verbose=0)
        test = trainer.evaluate(test_batches.map(every_output), return_dict=True, verbose=0)
    epochs = fitted.history
    training_seconds = sum(epoch["epoch_seconds"] for epoch in epochs)
    summary = {
        "data": {"source": splits.source, "cache": str(cache.directory), **splits.counts},
        "model": config.to_dict(),
        "parameters": model.count_params(),
        "vocabulary": str(vocabulary_path),
        "pretrained": None if pretrained is None else pretrained.describe(),
        **training.run_summary(args, policy, strategy, fitted),
        "batch_size": args.batch_size,
        "pack": args.pack,
        "weight_decay": args.weight_decay,
        "training_seconds": round(training_seconds, 1),
        "train_examples_per_second": round(splits.counts["train"] * len(epochs) / max(training_seconds, 1e-9), 1),
        "ensemble_weights": ensemble,
        "validation_accuracy": validation["accuracy"],  # the ensemble weights were fitted on it
        "test_accuracy": test["probability_accuracy"],
        "test_accuracy_by_branch": {branch: test[f"{branch}_accuracy"] for branch in BRANCHES},
        "test_loss": test["loss"],  # the sum of the branch losses
    }
    write_json_atomic(output_dir / "summary.json", summary)
    chief = output_dir == Path(args.output_dir)
    return TrainingRun(model, trainer, vectorizer, config, splits, summary, output_dir, chief)


def compiled_trainer(classifier, optimizer, jit_compile):
    """`training_model(classifier)` compiled with a loss and an accuracy per branch."""
    trainer = training_model(classifier)
    trainer.compile(
        optimizer=optimizer,
        loss={branch: keras.losses.BinaryCrossentropy() for branch in BRANCHES},
        metrics={name: [keras.metrics.BinaryAccuracy(name="accuracy")] for name in (*BRANCHES, "probability")},
        jit_compile=jit_compile,
    )
    return trainer


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_devices:
        training.split_cpu(args.cpu_devices)  # before TensorFlow initialises its devices
    with user_errors_exit(PROG, args.debug), distributed.exit_when_a_worker_is_lost():
        require_writable_directory(args.output_dir, "--output-dir")
        run = train(args)
    print(json.dumps(run.summary, indent=2, sort_keys=True))
    return run


if __name__ == "__main__":
    main()
