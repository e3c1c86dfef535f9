"""Real (non-padding) tokens per second of an app's training step on packed rows, against the same
documents in length-bucketed batches and in plainly padded ones; and each layout's padding share.

    python -m benchmarks.packed_training [--apps imdb_pretraining ...] [--examples N] [--batch-size B]
        [--rounds R]

Each app is an entry of `APP_CASES`: a function of the parsed arguments returning an `AppCase`,
that is, for every layout of `LAYOUTS` a compiled Keras model and the list of its batches
(`(inputs, labels, weights)` or `(inputs, labels)`), the same documents in each layout, and how
many token slots and real tokens a batch holds. A new app (the translator) is one more entry.
Each layout's model is fitted one epoch over its batches to trace it, then the layouts take
turns for `--rounds` epochs and each keeps its best epoch (`benchmarks.measurement`'s round
robin: the shared machine's load then weighs on all alike). The ratio to the peer is the real
tokens per second against plainly padded batches; against bucketed ones it is a goal field.

"imdb_pretraining": `pipelines.pretrain_imdb`'s masked-language-model step at the default
configuration on real reviews, its batches from `pretrain_imdb.masked_batches` in each layout
(packed: `pipelines.batching.pack_documents` rows of `sequence_length`). The padding share of
the classifier's attention branch is the same batches' (it reads the same first
`sequence_length` tokens of each review).

"translator": `pipelines.train_translator.packing_benchmark_layouts`, the translator's teacher-
forcing step on the same sentence pairs in each layout (its token slots and real tokens count
the source and the target input).
"""

import dataclasses
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import measurement
from models.imdb_text import adapt_review_vectorizer
from models.masked_language_model import build_masked_language_model
from models.sentiment_classifier import SentimentClassifierConfig
from pipelines import imdb_data
from pipelines import pretrain_imdb
from pipelines import train_imdb
from pipelines import train_translator

PEER_RATIO = "speedup_vs_padded"
GOAL_FIELDS = ("speedup_vs_bucketed", "padding_share", "real_tokens_per_s")
BENCH_ARGS = ["--rounds", "2"]
LAYOUTS = ("padded", "bucketed", "packed")  # the first is the peer


@dataclasses.dataclass(frozen=True)
class LayoutRun:
    """One layout of an app: its compiled model, its batches, and the token slots and real tokens in them."""

    model: keras.Model
    batches: list
    token_slots: int
    real_tokens: int


@dataclasses.dataclass(frozen=True)
class AppCase:
    """An app's training step in every layout of `LAYOUTS` (name -> `LayoutRun`), on the same documents."""

    name: str
    layouts: dict
    config: dict


def imdb_pretraining_case(args):
    config = SentimentClassifierConfig() if not args.smoke else train_imdb.SMOKE_MODEL
    texts = tf.constant([text for text, _ in measurement.imdb_test_reviews(args.examples)])
    vectorizer = adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(texts), config.vocabulary_size)
    config = dataclasses.replace(pretrain_imdb.pretraining_config(config), vocabulary_size=vectorizer.vocabulary_size())
    ids = imdb_data.token_ids(
        tf.data.Dataset.from_tensor_slices((texts, tf.zeros_like(texts, tf.int32))), vectorizer, config.sequence_length
    )
    layouts = {}
    for layout in LAYOUTS:
        batches = list(pretrain_imdb.masked_batches(ids, args.batch_size, config, seed=0, shuffle=False, layout=layout))
        model, _ = build_masked_language_model(config, packed=layout == "packed")
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
            jit_compile=False,  # shapes change from batch to batch in every layout
        )
        tokens = [inputs["packed_ids" if layout == "packed" else "token_ids"] for inputs, _, _ in batches]
        layouts[layout] = LayoutRun(
            model,
            batches,
            token_slots=sum(int(np.prod(batch.shape)) for batch in tokens),
            real_tokens=sum(int(tf.math.count_nonzero(batch)) for batch in tokens),
        )
    return AppCase("imdb_pretraining", layouts, {"model": config.to_dict()})


def translator_case(args):
    runs = train_translator.packing_benchmark_layouts(examples=args.examples, smoke=args.smoke, layouts=LAYOUTS)
    return AppCase("translator", {layout: LayoutRun(*run) for layout, run in runs.items()}, {"smoke": args.smoke})


# App name -> function of the parsed arguments returning its `AppCase`.
APP_CASES = {"imdb_pretraining": imdb_pretraining_case, "translator": translator_case}


def epoch_seconds(case, rounds):
    """`{layout: best seconds of one epoch}`: one warm-up epoch each, then `rounds` in turn."""
    datasets = {
        layout: tf.data.Dataset.from_generator(
            lambda run=run: iter(run.batches), output_signature=_signature(run)
        ).apply(tf.data.experimental.assert_cardinality(len(run.batches)))
        for layout, run in case.layouts.items()
    }
    steps = {
        layout: (
            lambda layout=layout: case.layouts[layout].model.fit(datasets[layout], epochs=1, verbose=0, shuffle=False)
        )
        for layout in case.layouts
    }
    for step in steps.values():
        step()  # tracing
    best = {layout: float("inf") for layout in steps}
    for _ in range(rounds):
        for layout, step in steps.items():
            start = time.perf_counter()
            step()
            best[layout] = min(best[layout], time.perf_counter() - start)
    return best


def _signature(run):
    return tf.nest.map_structure(lambda tensor: tf.TensorSpec([None] * tensor.shape.rank, tensor.dtype), run.batches[0])


def case_rows(case, rounds):
    seconds = epoch_seconds(case, rounds)
    real = {run.real_tokens for run in case.layouts.values()}
    if len(real) != 1:  # every layout must hold the same documents
        raise RuntimeError(f"The layouts of {case.name} hold different real tokens: {real}")
    rows = [
        {
            "app": case.name,
            "layout": layout,
            "batches": len(run.batches),
            "token_slots": run.token_slots,
            "real_tokens": run.real_tokens,
            "padding_share": 1 - run.real_tokens / run.token_slots,
            "best_epoch_s": seconds[layout],
            "real_tokens_per_s": run.real_tokens / seconds[layout],
        }
        for layout, run in case.layouts.items()
    ]
    by_layout = {row["layout"]: row["real_tokens_per_s"] for row in rows}
    for row in rows:
        row[PEER_RATIO] = row["real_tokens_per_s"] / by_layout["padded"]
        row["speedup_vs_bucketed"] = row["real_tokens_per_s"] / by_layout["bucketed"]
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        apps=dict(nargs="+", choices=sorted(APP_CASES), default=sorted(APP_CASES), help="the app cases to run"),
        examples=dict(type=int, default=512, help="real documents per epoch"),
        batch_size=dict(type=int, default=32, help="documents per batch"),
        rounds=dict(type=int, default=3, help="timed epochs per layout (after one warm-up epoch)"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.examples, args.batch_size, args.rounds = 16, 4, 1
    rows, configs = [], {}
    for name in args.apps:
        case = APP_CASES[name](args)
        configs[name] = case.config
        rows += case_rows(case, args.rounds)
    measurement.print_table(
        rows,
        [
            ("app", "app", "{}"),
            ("layout", "layout", "{}"),
            ("batches", "batches", "{}"),
            ("padding_share", "padding", "{:.1%}"),
            ("best_epoch_s", "best epoch s", "{:.2f}"),
            ("real_tokens_per_s", "real tokens/s", "{:,.0f}"),
            (PEER_RATIO, "x padded", "{:.2f}"),
            ("speedup_vs_bucketed", "x bucketed", "{:.2f}"),
        ],
    )
    payload = {"config": {**{k: v for k, v in vars(args).items() if k != "output"}, "apps": configs}, "rows": rows}
    measurement.write_results("packed_training" + ("_smoke" if args.smoke else ""), payload, args.output)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
