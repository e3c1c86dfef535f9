"""ONNX Runtime's fused attention against the unfused graph: the IMDB classifier's ONNX model with
each attention core rewritten into one `com.microsoft.MultiHeadAttention` node
(`export.onnx_fused_attention`), timed beside the tf2onnx model it comes from.

The classifier is the default configuration (`SentimentClassifierConfig()`: 1 encoder block, 4
heads of 16, 512 tokens of attention; untrained, with a vocabulary adapted on the reviews: the
time does not depend on the weights), or a trained run with `--run runs/imdb`. It is exported
with the project's exporter (`export.imdb.onnx_bundle`), whose bundle holds the tf2onnx graph
`model.onnx` and the same with fused attention, `model.fused.onnx`.
Printed and recorded: the fused nodes per attention layer (ONNX Runtime's own transformer optimizer,
`optimize_model(model_type="bert")`, fuses none of them), the largest probability difference of
the fused model from Keras and from the unfused model (real reviews, padded batches, and an empty
review: every key of its row masked), and each model's time on token ids at batch 1 (a review of
median length) and batch 32 (32 reviews, padded to the longest), best of `--rounds` in turn, as
a ratio to the unfused model measured in the same run. Both sessions run with
`benchmarks.serving_latency`'s options: every graph optimisation (`ORT_ENABLE_ALL`), sequential
execution, one intra-op thread per core, sleeping when idle (`benchmarks.int8_quantization.onnx_session`).

    python -m benchmarks.onnx_fused_attention [--run runs/imdb] [--rounds 20]
"""

import sys
import tempfile
from pathlib import Path

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402

from appkit.cli import positive_int  # noqa: E402
from benchmarks import measurement
from benchmarks.int8_quantization import onnx_session  # noqa: E402
from export.imdb.onnx_bundle import write_onnx_bundle  # noqa: E402
from export.imdb.onnx_predictor import FUSED_MODEL_FILE  # noqa: E402
from export.onnx_fused_attention import fused_attention_count  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from models.imdb_text import dense_token_ids  # noqa: E402
from models.imdb_text import save_review_vocabulary  # noqa: E402
from models.sentiment_classifier import SentimentClassifierConfig  # noqa: E402
from models.sentiment_classifier import build_sentiment_classifier  # noqa: E402
from pipelines.explain_imdb import load_classifier  # noqa: E402
from pipelines.train_imdb import SMOKE_MODEL  # noqa: E402

PEER_RATIO = "ms_vs_unfused"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = ("fused_nodes",)  # shown beside the ratio in `make bench`'s table (benchmarks/run_all.py)
BENCH_ARGS = ["--rounds", "10"]  # `make bench` (benchmarks/run_all.py): fewer rounds

GRAPHS = ("unfused", "fused")


def classifier(args, reviews):
    """`(model, vectorizer, config)`: a trained run's, or a fresh classifier with a vocabulary adapted on `reviews`."""
    if args.run:
        return load_classifier(args.run)
    config = SMOKE_MODEL if args.smoke else SentimentClassifierConfig()
    keras.utils.set_random_seed(0)  # the same untrained weights in every run
    vectorizer = adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(reviews), config.vocabulary_size)
    return build_sentiment_classifier(config), vectorizer, config


def largest_differences(model, run, id_batches):
    """`{"fused_vs_keras", "fused_vs_unfused"}`: the largest probability differences on `id_batches`."""
    differences = {"fused_vs_keras": 0.0, "fused_vs_unfused": 0.0}
    for ids in id_batches:
        fused = run["fused"](ids).astype(np.float64)
        keras_probability = np.asarray(model(ids, training=False), np.float64).reshape(-1)
        differences["fused_vs_keras"] = max(
            differences["fused_vs_keras"], float(np.max(np.abs(fused - keras_probability)))
        )
        differences["fused_vs_unfused"] = max(
            differences["fused_vs_unfused"], float(np.max(np.abs(fused - run["unfused"](ids))))
        )
    return differences


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        run=dict(default=None, help="a trained IMDB run directory (default: a fresh default-configuration classifier)"),
        rounds=dict(type=positive_int, default=20, help="timing rounds per batch size (best of them is kept)"),
    )
    args = parser.parse_args(argv)
    reviews_count = 256
    if args.smoke:
        args.rounds, reviews_count = 2, 8
    reviews = [text for text, _ in measurement.imdb_test_reviews(reviews_count)]
    model, vectorizer, config = classifier(args, reviews)
    by_length = sorted(reviews, key=len)
    batches = {"batch1": [by_length[len(by_length) // 2]], "batch32": reviews[:32]}
    ids = {
        batch: dense_token_ids(tf.constant(texts), vectorizer, config.max_tokens).numpy()
        for batch, texts in batches.items()
    }
    # Parity also on the shortest and longest reviews together (the most padding) and an empty review (a row with every key masked).
    parity_batches = [
        *ids.values(),
        dense_token_ids(tf.constant([by_length[0], by_length[-1], ""]), vectorizer, config.max_tokens).numpy(),
    ]
    with tempfile.TemporaryDirectory(prefix="onnx_fused_attention_") as directory:
        directory = Path(directory)
        bundle = write_onnx_bundle(
            model,
            save_review_vocabulary(vectorizer, directory / "vocabulary.txt"),
            vectorizer.vocabulary_size(),
            config.max_tokens,
            directory / "onnx",
        )
        fused_nodes = fused_attention_count(onnx.load(str(bundle / FUSED_MODEL_FILE)))
        run = {"unfused": onnx_session(bundle), "fused": onnx_session(bundle, fused=True)}
        differences = largest_differences(model, run, parity_batches)
        seconds = {
            batch: measurement.best_seconds_round_robin(
                {name: (lambda step=step, batch=batch: step(ids[batch])) for name, step in run.items()}, args.rounds
            )
            for batch in ids
        }
    rows = [
        {
            "graph": graph,
            "batch": batch,
            "tokens": int(ids[batch].shape[1]),
            "attention_layers": config.num_layers,
            "fused_nodes": fused_nodes if graph == "fused" else 0,
            "ms": 1e3 * seconds[batch][graph],
            "ms_vs_unfused": seconds[batch][graph] / seconds[batch]["unfused"],
        }
        for batch in ids
        for graph in GRAPHS
    ]
    measurement.print_table(
        rows,
        [
            ("graph", "graph", "{}"),
            ("batch", "batch", "{}"),
            ("tokens", "padded tokens", "{}"),
            ("fused_nodes", "fused nodes", "{}"),
            ("attention_layers", "attention layers", "{}"),
            ("ms", "ms", "{:.2f}"),
            ("ms_vs_unfused", "time / unfused", "{:.3f}"),
        ],
    )
    print(
        f"fused MultiHeadAttention nodes per attention layer: {fused_nodes / config.num_layers:g}; largest probability "
        f"difference: fused vs Keras {differences['fused_vs_keras']:.1e}, fused vs unfused {differences['fused_vs_unfused']:.1e}"
    )
    measurement.write_results(
        "onnx_fused_attention" + ("_smoke" if args.smoke else ""),
        {
            "config": {"run": args.run, "rounds": args.rounds, "model": config.to_dict()},
            "max_abs_probability_difference": differences,
            "rows": rows,
        },
        args.output,
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
