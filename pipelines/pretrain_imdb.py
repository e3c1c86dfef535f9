"""Pretrains the IMDB classifier's attention branch as a masked language model on the training reviews.

    python -m pipelines.pretrain_imdb [--data PATH] [--output-dir runs/imdb_pretrain] [--epochs N]
        [--smoke] [--pack] [any model flag of pipelines.train_imdb] ...

Self-supervised: the labels are never read. The reviews are those `pipelines.train_imdb` trains
on with the same data flags (the official training split minus its validation slice, which
gives the validation loss here; the test split is never read), tokenised by the same vectoriser,
adapted the same way. Each batch is masked in `tf.data` (`models.token_masking`: 15 % of the
words, BERT's 80/10/10, new masks every epoch) and `models.masked_language_model` learns to
predict them; its encoder is built by the classifier's own `review_encoder`.

`--pack` lays each batch's masked reviews into rows of `sequence_length` tokens instead of
padding them (`pipelines.batching.pack_documents`; attention, positions and bigrams stay within
each review): the same reviews, masks and loss per batch, without the padding. The checkpoint is
the same either way.

`model.fit` shows Keras's progress bar; each epoch is committed (`pipelines.resumable_training`),
so rerunning the same command after a kill resumes from the last finished epoch, and a longer
`--epochs` continues a finished run. At the end the best epoch's encoder (lowest validation loss)
is written with its configuration and vocabulary (`pipelines.encoder_checkpoint`), which
`pipelines.train_imdb` and the main job load by default from `runs/imdb_pretrain`.
`<output-dir>/summary.json` holds the masked-token loss and accuracy per epoch and the time.

The defaults (the classifier's encoder, dropout 0.1, batch 32, learning rate 2e-3, 2 epochs) keep
the run short enough for a CPU; most of a step is the vocabulary-wide softmax at the masked
positions. So short a pretraining does not help the classifier (the IMDB model card's ablation,
docs/models/imdb_classifier.md); `--epochs N` continues a finished run.
"""

import argparse
import dataclasses
import functools
import json
from pathlib import Path

import keras
import tensorflow as tf

from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from keras_attn.validation import check_choice
from models.masked_language_model import build_masked_language_model
from models.packed_documents import PACKED_IDS
from models.packed_documents import SEGMENT_IDS
from models.packed_documents import TOKEN_INDEX
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_review_encoder
from models.sentiment_classifier import load_encoder_weights
from models.token_masking import MASK_ID
from models.token_masking import MASK_RATE
from models.token_masking import mask_tokens
from pipelines import distributed
from pipelines import encoder_checkpoint
from pipelines import imdb_data
from pipelines import train_imdb
from pipelines import training
from pipelines.batching import pack_documents
from pipelines.batching import with_counted_batches

PROG = "python -m pipelines.pretrain_imdb"
PRETRAINING_DROPOUT = 0.1  # BERT's; the classifier fine-tunes with its own
EPOCHS = 2


def parse_args(argv=None):
    """The flags, each checked against its range: a bad value exits 2 with one line, before any work."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    train_imdb.add_data_arguments(parser)
    training.add_training_arguments(
        parser,
        output_dir=f"runs/{encoder_checkpoint.DEFAULT_DIRECTORY_NAME}",
        epochs=EPOCHS,
        learning_rate=2e-3,
        weight_decay=0.01,
        warmup_fraction=0.1,
        patience=2,
        jit_compile_help="XLA-compile the train/eval steps",
    )
    parser.add_argument("--batch-size", type=positive_int, default=32)
    train_imdb.add_pack_argument(parser)
    training.add_config_arguments(parser, pretraining_config(SentimentClassifierConfig()))
    args = parser.parse_args(argv)
    with user_errors_exit(PROG, args.debug):
        if args.strategy == distributed.MULTI_WORKER:
            raise ValueError(
                f"`--strategy` must be one of {training.STRATEGIES} for pretraining. Received: --strategy={args.strategy}"
            )
        model_config(args)  # the flags' combination (e.g. --sequence-length above --max-tokens)
    return args


def pretraining_config(config):
    return dataclasses.replace(config, dropout=PRETRAINING_DROPOUT)


def model_config(args):
    """The classifier's default (or smoke) configuration with pretraining's dropout, overridden by
    the model flags given: the encoder fields must be the classifier's for it to load the result."""
    return training.configured(
        pretraining_config(train_imdb.SMOKE_MODEL if args.smoke else SentimentClassifierConfig()), args
    )


# How a batch of reviews is laid out: length-bucketed and padded to its bucket (the default),
# padded to its longest review, or packed into rows (`--pack`).
LAYOUTS = ("bucketed", "padded", "packed")


def masked_batches(ids, batch_size, config, seed, shuffle, layout="bucketed"):
    """Batches of `(ids, label)` masked by `mask_tokens`: `(inputs, labels, weights)`.

    Shuffled batches (training) get new masks at every pass; the others (validation) the same ones,
    so that their loss compares across epochs. The review labels are dropped. `layout`, one of
    `LAYOUTS`: "bucketed", reviews of similar length padded to their bucket; "padded", reviews in
    any order padded to the longest; "packed", those masked, then packed into rows
    (`packed_masking`).
    """
    check_choice("layout", layout, LAYOUTS)
    if layout == "bucketed":
        batching = functools.partial(imdb_data.batched, sequence_length=config.sequence_length)
    else:
        batching = imdb_data.padded
    batches = with_counted_batches(batching(ids, batch_size, shuffle=shuffle, seed=seed, drop_remainder=shuffle))
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=shuffle).batch(2)  # (2,) int64 each

    def masked(batch, batch_seed):
        masking = mask_tokens(batch[0], batch_seed, config.vocabulary_size)
        return packed_masking(*masking, config.sequence_length) if layout == "packed" else masking

    return (
        tf.data.Dataset.zip(batches, seeds).map(masked, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    )


def packed_masking(inputs, labels, weights, row_length):
    """`mask_tokens`' batch with its corrupted reviews packed into rows of `row_length`
    (`pipelines.batching.pack_documents`, read by `build_masked_language_model(packed=True)`): the
    masked positions are mapped into the flattened rows; the targets and weights are unchanged, so
    the loss is the padded batch's. Masking before packing keeps the lengths (masks are words)."""
    packed = pack_documents(inputs["token_ids"], row_length)
    positions = tf.gather(packed[TOKEN_INDEX], inputs["masked_positions"], batch_dims=1)  # (batch, targets)
    return (
        {PACKED_IDS: packed[PACKED_IDS], SEGMENT_IDS: packed[SEGMENT_IDS], "masked_positions": positions},
        labels,
        weights,
    )


def pretrain(args):
    """Data -> vectoriser -> masked-language-model fit (resumed if interrupted) -> encoder checkpoint.

    Returns:
        The summary written to `<output-dir>/summary.json`.
    """
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    policy, strategy = training.set_up(args)
    cache = imdb_data.load_cache(args.data, args.cache_dir, allow_download=not args.no_download)
    splits = imdb_data.split_reviews(cache, **train_imdb.data_limits(args))
    vectorizer, config, _ = train_imdb.review_vectorizer(splits, model_config(args), output_dir)
    train_ids, validation_ids = (
        imdb_data.token_ids(split, vectorizer, config.sequence_length) for split in (splits.train, splits.validation)
    )
    train_batches, validation_batches = (
        masked_batches(ids, args.batch_size, config, args.seed, shuffle, layout="packed" if args.pack else "bucketed")
        for ids, shuffle in ((train_ids, True), (validation_ids, False))
    )
    total_steps = args.epochs * int(train_batches.cardinality())
    with strategy.scope():
        model, encoder = build_masked_language_model(config, packed=args.pack)
        model.compile(
            optimizer=training.adamw_with_warmup(
                args.learning_rate, total_steps, args.warmup_fraction, args.weight_decay
            ),
            # The mean over the masked tokens (the weights), not over the filler slots too.
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="masked_accuracy")],
            jit_compile=args.jit_compile,
        )
    # One machine only (parse_args refuses multi_worker): the multi-worker arguments are unused.
    fitted = training.fit(
        args,
        strategy,
        policy,
        model,
        total_steps,
        train_batches,
        validation_batches,
        monitor="val_loss",
        mode="min",
        losses=None,
        metrics=None,
        epoch_batches=None,
    )
    summary = {
        "data": {
            "source": splits.source,
            "cache": str(cache.directory),
            "train": splits.counts["train"],
            "validation": splits.counts["validation"],
        },
        "parameters": model.count_params(),
        "encoder_parameters": encoder.count_params(),
        "masking": {"rate": MASK_RATE, "mask_id": MASK_ID},
        **training.run_summary(args, policy, strategy, fitted),
        "batch_size": args.batch_size,
        "pack": args.pack,
        "weight_decay": args.weight_decay,
        "training_seconds": round(sum(epoch["epoch_seconds"] for epoch in fitted.history), 1),
        "epochs": [
            {
                key: row[key]
                for key in ("epoch", "loss", "masked_accuracy", "val_loss", "val_masked_accuracy", "epoch_seconds")
            }
            for row in fitted.history
        ],
    }
    if args.pack:  # the checkpoint is the padded encoder's, whichever way it was trained: same weights
        packed_encoder, encoder = encoder, build_review_encoder(config)
        load_encoder_weights(encoder, packed_encoder)
    return encoder_checkpoint.write(output_dir, encoder, config, summary)  # the best epoch's encoder


def main(argv=None):
    args = parse_args(argv)
    with user_errors_exit(PROG, args.debug):
        require_writable_directory(args.output_dir, "--output-dir")
        summary = pretrain(args)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
