"""int8 quantisation of the IMDB classifier: accuracy, latency and size of each int8 model beside its float peer.

One trained classifier (`--run`, a training output directory as the main job writes it: `runs/imdb`)
in four forms, each run on the same token ids:

- `keras_float`: the Keras model;
- `keras_int8`: a copy after `model.quantize("int8")` (Keras quantises its `Dense`, `EinsumDense`
  and `Embedding` layers; the layers with weights it leaves in float32 are printed and recorded:
  on this classifier the position table and the n-gram branch, `NgramBag`'s feature weights and
  `SparseLinear`'s kernel, custom layers Keras cannot quantise);
- `onnx_float`: `model.onnx` of the export's ONNX bundle (`export.imdb.onnx_bundle`) in ONNX Runtime;
- `onnx_int8`: the bundle's `model.int8.onnx` (ONNX Runtime's dynamic quantisation, int8 weights).

For each: accuracy on the official test split (25,000 reviews; `--max-test` caps it) and its
difference from `keras_float` in points, the labels it shares with `keras_float`, batch-1 and
batch-32 latency as a ratio to its float peer of the same runtime (all four in turn, best of
`--rounds`), and the size of its weights (Keras: the `.weights.h5` file; ONNX: the model file) as a
ratio to its float peer. Both runtimes take token ids (the tokeniser is timed by neither); ONNX
Runtime runs with `benchmarks.serving_latency`'s session options, one intra-op thread per core that
sleeps when idle (onnxruntime's default threads spin after a call and take the cores from the
next model timed, which distorts the ratios on a machine with few cores). `--smoke` uses a freshly built, untrained
classifier of the training smoke configuration (`pipelines.train_imdb.SMOKE_MODEL`) with a
vocabulary adapted on the reviews, for the tests.

    python -m benchmarks.int8_quantization [--run runs/imdb] [--max-test 25000] [--rounds 20]
"""

import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from appkit.cli import positive_int  # noqa: E402
from benchmarks import measurement
from benchmarks.serving_latency import ort_session_options  # noqa: E402
from export.imdb.onnx_bundle import write_onnx_bundle  # noqa: E402
from export.imdb.onnx_predictor import MODEL_FILES  # noqa: E402
from export.imdb.onnx_predictor import OnnxSentimentPredictor  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from models.imdb_text import dense_token_ids  # noqa: E402
from models.imdb_text import save_review_vocabulary  # noqa: E402
from models.sentiment_classifier import build_sentiment_classifier  # noqa: E402
from pipelines.explain_imdb import load_classifier  # noqa: E402
from pipelines.train_imdb import SMOKE_MODEL  # noqa: E402

PEER_RATIO = "batch32_vs_float"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = (
    "accuracy",
    "points_vs_keras_float",
    "size_vs_float",
)  # shown beside the ratio in `make bench`'s table (benchmarks/run_all.py)
BENCH_ARGS = [
    "--rounds",
    "3",
]  # `make bench` (benchmarks/run_all.py): all 25,000 test reviews (the goal's set), fewer timing rounds

MODELS = ("keras_float", "keras_int8", "onnx_float", "onnx_int8")
FLOAT_PEER = {
    "keras_float": "keras_float",
    "keras_int8": "keras_float",
    "onnx_float": "onnx_float",
    "onnx_int8": "onnx_float",
}
TEST_REVIEWS = 25_000
_BATCH = 64  # reviews per call while measuring accuracy


def keras_int8_copy(model, config):
    """A copy of `model` after `quantize("int8")`, and the names of its layers with weights left in float."""
    quantized = build_sentiment_classifier(config)
    quantized.set_weights(model.get_weights())
    with warnings.catch_warnings():  # Keras warns once per layer it has no int8 form for: listed below instead
        warnings.simplefilter("ignore")
        quantized.quantize("int8")
    # Keras's own walk over nested layers (custom layers' sublayers are attributes, not `.layers`).
    leaves = [
        layer
        for layer in quantized._flatten_layers(include_self=False)
        if not list(layer._flatten_layers(include_self=False))
    ]
    left_in_float = [
        f"{layer.name} ({type(layer).__name__})"
        for layer in leaves
        if layer.weights and layer.dtype_policy.quantization_mode is None
    ]
    return quantized, left_in_float


def keras_predictor(model):
    """Token ids -> probabilities of `model` as one compiled graph (no retracing across shapes)."""
    call = tf.function(lambda ids: model(ids, training=False), input_signature=[tf.TensorSpec([None, None], tf.int32)])
    return lambda ids: call(ids).numpy().reshape(-1)


def onnx_session(bundle, **model):
    """Token ids -> probabilities of one of the bundle's models (`model`: the predictor's `quantized` or
    `fused` flag; none: the float model), straight through its ONNX Runtime session (one intra-op thread per core)."""
    session = OnnxSentimentPredictor(bundle, ort_session_options(os.cpu_count()), **model).session
    name = session.get_inputs()[0].name
    return lambda ids: session.run(None, {name: ids})[0].reshape(-1)


def weights_bytes(model, path):
    model.save_weights(str(path))
    return Path(path).stat().st_size


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        run=dict(default="runs/imdb", help="a trained IMDB run directory (default runs/imdb, the main job's)"),
        max_test=dict(
            type=positive_int, default=TEST_REVIEWS, help=f"test reviews scored (default all {TEST_REVIEWS:,})"
        ),
        rounds=dict(type=positive_int, default=20, help="timing rounds per batch size (best of them is kept)"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.max_test, args.rounds = min(args.max_test, 48), 2
    labelled = measurement.imdb_test_reviews(args.max_test)
    texts, labels = [text for text, _ in labelled], np.array([label for _, label in labelled])
    if args.smoke:
        config = SMOKE_MODEL
        vectorizer = adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(texts), config.vocabulary_size)
        model = build_sentiment_classifier(config)
    else:
        model, vectorizer, config = load_classifier(args.run)
    int8_model, left_in_float = keras_int8_copy(model, config)
    # Scored in batches of reviews of similar length (a batch is padded to its longest review).
    by_length = np.argsort([len(text) for text in texts], kind="stable")
    id_batches = [
        dense_token_ids(
            tf.constant([texts[i] for i in by_length[start : start + _BATCH]]), vectorizer, config.max_tokens
        ).numpy()
        for start in range(0, len(texts), _BATCH)
    ]
    with tempfile.TemporaryDirectory(prefix="int8_quantization_") as directory:
        directory = Path(directory)
        bundle = write_onnx_bundle(
            model,
            save_review_vocabulary(vectorizer, directory / "vocabulary.txt"),
            vectorizer.vocabulary_size(),
            config.max_tokens,
            directory / "onnx",
        )
        predict = {
            "keras_float": keras_predictor(model),
            "keras_int8": keras_predictor(int8_model),
            "onnx_float": onnx_session(bundle, quantized=False),
            "onnx_int8": onnx_session(bundle, quantized=True),
        }
        sizes = {
            "keras_float": weights_bytes(model, directory / "float.weights.h5"),
            "keras_int8": weights_bytes(int8_model, directory / "int8.weights.h5"),
            "onnx_float": (bundle / MODEL_FILES[False]).stat().st_size,
            "onnx_int8": (bundle / MODEL_FILES[True]).stat().st_size,
        }
        predicted = {name: np.concatenate([run(ids) for ids in id_batches]) >= 0.5 for name, run in predict.items()}
        # Batch 1: the review of median length; batch 32: the first 32 in the stored (shuffled) order.
        one_review = dense_token_ids(tf.constant([texts[by_length[len(texts) // 2]]]), vectorizer, config.max_tokens)
        thirty_two = dense_token_ids(tf.constant(texts[:32]), vectorizer, config.max_tokens)
        seconds = {
            batch: measurement.best_seconds_round_robin(
                {name: (lambda run=run, ids=ids: run(ids)) for name, run in predict.items()}, args.rounds
            )
            for batch, ids in (("batch1", one_review.numpy()), ("batch32", thirty_two.numpy()))
        }
    accuracy = {name: float(np.mean(predicted[name] == labels[by_length])) for name in MODELS}
    rows = []
    for name in MODELS:
        peer = FLOAT_PEER[name]
        rows.append(
            {
                "model": name,
                "test_reviews": len(texts),
                "accuracy": accuracy[name],
                "points_vs_keras_float": 100 * (accuracy[name] - accuracy["keras_float"]),
                "labels_as_keras_float": float(np.mean(predicted[name] == predicted["keras_float"])),
                "batch1_ms": 1e3 * seconds["batch1"][name],
                "batch32_ms": 1e3 * seconds["batch32"][name],
                "batch1_vs_float": seconds["batch1"][name] / seconds["batch1"][peer],
                "batch32_vs_float": seconds["batch32"][name] / seconds["batch32"][peer],
                "bytes": sizes[name],
                "size_vs_float": sizes[name] / sizes[peer],
            }
        )
    measurement.print_table(
        rows,
        [
            ("model", "model", "{}"),
            ("accuracy", "accuracy", "{:.2%}"),
            ("points_vs_keras_float", "points vs Keras float", "{:+.2f}"),
            ("labels_as_keras_float", "labels as Keras float", "{:.2%}"),
            ("batch1_ms", "batch 1 ms", "{:.2f}"),
            ("batch1_vs_float", "batch 1 / float", "{:.2f}"),
            ("batch32_ms", "batch 32 ms", "{:.1f}"),
            ("batch32_vs_float", "batch 32 / float", "{:.2f}"),
            ("bytes", "bytes", "{:,}"),
            ("size_vs_float", "size / float", "{:.2f}"),
        ],
    )
    print(
        f"test reviews: {len(texts):,}; layers with weights Keras left in float32: {', '.join(left_in_float) or 'none'}"
    )
    payload = {
        "config": {
            "run": None if args.smoke else args.run,
            "max_test": args.max_test,
            "rounds": args.rounds,
            "model": config.to_dict(),
        },
        "keras_int8_left_in_float": left_in_float,
        "rows": rows,
    }
    measurement.write_results("int8_quantization" + ("_smoke" if args.smoke else ""), payload, args.output)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
