"""Serving the IMDB classifier under load: Keras `predict`, the SavedModel and ONNX Runtime.

A freshly built classifier (`models.sentiment_classifier`, default configuration, untrained:
latency does not depend on the weights) with a vocabulary adapted on real IMDB test reviews is
exported with the project's exporters into a temporary directory and reloaded. Each runtime then
serves requests of real reviews, end to end from raw strings, through a server of
`--server-threads` worker threads (default: the machine's cores) that answer in arrival order, as
a model server's fixed thread pool does, to 1 and to `--clients` concurrent client threads that
send their requests back to back (a request's latency counts its wait in the queue):

- Keras: the training vectoriser (eager), then `model.predict` on the token ids;
- SavedModel: `serving_default(reviews=...)` of the reloaded SavedModel (TF string ops
  tokenise inside the graph);
- ONNX Runtime: `OnnxSentimentPredictor.predict` of the bundle (Python tokeniser +
  onnxruntime), its session options set deliberately: every graph optimisation
  (`ORT_ENABLE_ALL`), sequential execution, `--ort-threads` intra-op threads per request
  (default 1: the server's threads already use the cores) that sleep rather than spin when idle.

At batch 1 each request is one review (latency percentiles p50/p99 over every request of the
configuration); at batch 32 each request is 32 reviews (throughput in reviews/s over the wall
time). The configurations run one after another, each after a warm-up request per server thread; the
ratios compare runtimes measured in the same run.

    python -m benchmarks.serving_latency [--clients 8] [--requests 400] [--server-threads 2] [--ort-threads 1]
"""

import concurrent.futures
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from export.imdb.onnx_bundle import write_onnx_bundle  # noqa: E402
from export.imdb.onnx_predictor import OnnxSentimentPredictor  # noqa: E402
from export.imdb.savedmodel import write_savedmodel  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from models.imdb_text import dense_token_ids  # noqa: E402
from models.imdb_text import save_review_vocabulary  # noqa: E402
from models.sentiment_classifier import SentimentClassifierConfig  # noqa: E402
from models.sentiment_classifier import build_sentiment_classifier  # noqa: E402

PEER_RATIO = "p50_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = (
    "p50_ms",
    "p99_ms",
    "p99_over_p50",
    "throughput_vs_keras",
)  # shown beside the ratio in `make bench`'s table (benchmarks/run_all.py)
BENCH_ARGS = ["--requests", "200"]  # `make bench` (benchmarks/run_all.py): half the requests per configuration

RUNTIMES = ("keras", "saved_model", "onnx_runtime")


def ort_session_options(threads):
    """The ONNX Runtime session options this benchmark serves with (see the module docstring)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    # Idle worker threads sleep instead of spinning: with concurrent clients on few cores a
    # spinning pool takes the cores the other requests are waiting for.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def exported_runtimes(config, reviews, directory, ort_threads):
    """Builds and exports the classifier; `{runtime: predict(list of str) -> probabilities}`."""
    vectorizer = adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(reviews), config.vocabulary_size)
    vocabulary_path = save_review_vocabulary(vectorizer, Path(directory) / "vocabulary.txt")
    model = build_sentiment_classifier(config)
    saved_model_dir = write_savedmodel(
        model, vocabulary_path, config.vocabulary_size, config.max_tokens, Path(directory) / "savedmodel"
    )
    onnx_dir = write_onnx_bundle(
        model, vocabulary_path, vectorizer.vocabulary_size(), config.max_tokens, Path(directory) / "onnx"
    )
    serving = tf.saved_model.load(str(saved_model_dir)).signatures["serving_default"]
    predictor = OnnxSentimentPredictor(onnx_dir, session_options=ort_session_options(ort_threads))
    return {
        "keras": lambda batch: model.predict(
            dense_token_ids(tf.constant(batch), vectorizer, config.max_tokens), batch_size=len(batch), verbose=0
        ).reshape(-1),
        "saved_model": lambda batch: serving(reviews=tf.constant(batch))["probability"].numpy(),
        "onnx_runtime": lambda batch: predictor.predict(batch)["probability"],
    }


def serve(predict, requests, clients, server_threads):
    """Sends `requests` (lists of reviews) from `clients` threads, each its share back to back, to a
    server of `server_threads` worker threads that answer in arrival order (as a model server's
    fixed thread pool does); returns (per-request latencies in seconds: from sending to the answer,
    waiting included; wall seconds of the load). One warm-up request per worker is not counted."""
    shares = [requests[index::clients] for index in range(clients)]
    latencies = [[] for _ in range(clients)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=server_threads) as server:
        for warmup in [server.submit(predict, requests[0]) for _ in range(server_threads)]:
            warmup.result()

        def client(index):
            for batch in shares[index]:
                start = time.perf_counter()
                server.submit(predict, batch).result()  # a failed request raises here, never a silent gap
                latencies[index].append(time.perf_counter() - start)

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as senders:
            for sent in [senders.submit(client, index) for index in range(clients)]:
                sent.result()
        wall = time.perf_counter() - start
    return [latency for client_latencies in latencies for latency in client_latencies], wall


def measure(runtimes, reviews, batch_size, clients, request_count, server_threads):
    """One row per runtime: p50/p99 latency and reviews/s for `request_count` requests of
    `batch_size` reviews from `clients` threads."""
    cycled = itertools.cycle(reviews)
    requests = [list(itertools.islice(cycled, batch_size)) for _ in range(max(request_count, clients))]
    rows = []
    for runtime in RUNTIMES:
        latencies, wall = serve(runtimes[runtime], requests, clients, server_threads)
        p50, p99 = np.percentile(latencies, [50, 99])
        rows.append(
            {
                "runtime": runtime,
                "batch": batch_size,
                "clients": clients,
                "requests": len(latencies),
                "p50_ms": p50 * 1e3,
                "p99_ms": p99 * 1e3,
                "p99_over_p50": p99 / p50,
                "reviews_per_s": len(latencies) * batch_size / wall,
            }
        )
    keras_row = rows[RUNTIMES.index("keras")]
    for row in rows:
        row["p50_vs_keras"] = row["p50_ms"] / keras_row["p50_ms"]
        row["throughput_vs_keras"] = row["reviews_per_s"] / keras_row["reviews_per_s"]
    return rows


def check_agreement(runtimes, reviews):
    """The largest probability difference between the runtimes on the same reviews (they serve one model)."""
    outputs = [np.asarray(runtimes[runtime](reviews), np.float64) for runtime in RUNTIMES]
    return float(max(np.max(np.abs(output - outputs[0])) for output in outputs[1:]))


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        batch_sizes=dict(type=int, nargs="+", default=[1, 32]),
        clients=dict(type=int, default=8, help="concurrent client threads of the loaded runs"),
        requests=dict(type=int, default=400, help="requests per configuration (at batch 32: a quarter)"),
        server_threads=dict(type=int, default=os.cpu_count(), help="the server's worker threads"),
        ort_threads=dict(type=int, default=1, help="ONNX Runtime intra-op threads per request"),
        vocabulary_size=dict(type=int, default=20_000),
    )
    args = parser.parse_args(argv)
    config = SentimentClassifierConfig(vocabulary_size=args.vocabulary_size)
    reviews_count = 256
    if args.smoke:
        args.batch_sizes, args.clients, args.requests, reviews_count = [1, 2], 2, 4, 4
        config = SentimentClassifierConfig(
            vocabulary_size=200,
            max_tokens=32,
            sequence_length=32,
            embedding_dim=8,
            num_heads=2,
            intermediate_dim=8,
            bigram_buckets=64,
        )
    reviews = [text for text, _ in measurement.imdb_test_reviews(reviews_count)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="serving_latency_") as directory:
        runtimes = exported_runtimes(config, reviews, directory, args.ort_threads)
        agreement = check_agreement(runtimes, reviews[:32])
        for batch, clients in itertools.product(args.batch_sizes, sorted({1, args.clients})):
            request_count = args.requests if batch == 1 else max(args.requests // 4, 1)
            rows += measure(runtimes, reviews, batch, clients, request_count, args.server_threads)
    measurement.print_table(
        rows,
        [
            ("runtime", "runtime", "{}"),
            ("batch", "batch", "{}"),
            ("clients", "clients", "{}"),
            ("requests", "requests", "{}"),
            ("p50_ms", "p50 ms", "{:.2f}"),
            ("p99_ms", "p99 ms", "{:.2f}"),
            ("p99_over_p50", "p99/p50", "{:.2f}"),
            ("reviews_per_s", "reviews/s", "{:.1f}"),
            ("p50_vs_keras", "p50 / Keras", "{:.3f}"),
            ("throughput_vs_keras", "reviews/s / Keras", "{:.2f}"),
        ],
    )
    print(f"largest probability difference between the runtimes: {agreement:.1e}")
    payload = {
        "config": {**{k: v for k, v in vars(args).items() if k != "output"}, "model": config.to_dict()},
        "max_abs_probability_difference": agreement,
    }
    measurement.write_results(
        "serving_latency" + ("_smoke" if args.smoke else ""), {**payload, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
