"""Inference latency of the exported IMDB classifier: TF SavedModel vs ONNX Runtime.

A freshly built classifier (`models.sentiment_classifier`, default configuration, untrained:
latency does not depend on the weights) with a vocabulary adapted on real IMDB reviews is
exported with the project's exporters (`export.imdb.savedmodel.write_savedmodel`,
`export.imdb.onnx_bundle.write_onnx_bundle`) into a temporary directory, reloaded, and timed on real
reviews at batch 1 and 32 (in turn, `--repeats` times, best time each), end to end from raw
strings:

- TF SavedModel: `serving_default(reviews=...)` of the reloaded SavedModel (TF string ops
  tokenise inside the graph);
- ONNX Runtime: `OnnxSentimentPredictor.predict` of the bundle (Python tokeniser + onnxruntime),
  and its `session.run` on the token ids alone.

    python -m benchmarks.export_latency
"""

import itertools
import sys
import tempfile
from pathlib import Path

from benchmarks import measurement

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from export.imdb.onnx_bundle import write_onnx_bundle  # noqa: E402
from export.imdb.onnx_predictor import OnnxSentimentPredictor  # noqa: E402
from export.imdb.savedmodel import write_savedmodel  # noqa: E402
from models.sentiment_classifier import SentimentClassifierConfig  # noqa: E402
from models.sentiment_classifier import build_sentiment_classifier  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from models.imdb_text import save_review_vocabulary  # noqa: E402

def export_classifier(config, reviews, directory):
    """Builds, exports and reloads the classifier; returns (SavedModel signature, ONNX predictor)."""
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
    return serving, OnnxSentimentPredictor(onnx_dir)


def measure(serving, predictor, reviews, batch_size, repeats):
    batch = list(itertools.islice(itertools.cycle(reviews), batch_size))
    strings = tf.constant(batch)
    ids = predictor.token_ids(batch)
    best = measurement.best_seconds_round_robin(
        {
            "saved_model": lambda: serving(reviews=strings),
            "onnx": lambda: predictor.predict(batch),
            "session": lambda: predictor.session.run(None, {predictor.input_name: ids}),
        },
        repeats,
    )
    saved_model_s, onnx_s, session_s = best["saved_model"], best["onnx"], best["session"]
    expected = serving(reviews=strings)["probability"].numpy()
    received = predictor.predict(batch)["probability"]
    return {
        "batch": batch_size,
        "tokens_in_batch": int(ids.shape[0] * ids.shape[1]),
        "saved_model_ms": saved_model_s * 1e3,
        "onnx_runtime_ms": onnx_s * 1e3,
        "onnx_session_only_ms": session_s * 1e3,
        "onnx_over_saved_model": onnx_s / saved_model_s,
        "max_abs_probability_difference": float(np.max(np.abs(expected - received))),
    }


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        batch_sizes=dict(type=int, nargs="+", default=[1, 32]),
        repeats=dict(type=int, default=20),
        vocabulary_size=dict(type=int, default=20_000),
    )
    args = parser.parse_args(argv)
    config = SentimentClassifierConfig(vocabulary_size=args.vocabulary_size)
    reviews_count = 64
    if args.smoke:
        args.batch_sizes, args.repeats, reviews_count = [1, 2], 2, 4
        config = SentimentClassifierConfig(
            vocabulary_size=200, max_tokens=32, sequence_length=32, embedding_dim=8, num_heads=2,
            intermediate_dim=8, bigram_buckets=64,
        )
    reviews = [text for text, _ in measurement.imdb_test_reviews(reviews_count)]
    with tempfile.TemporaryDirectory(prefix="export_latency_") as directory:
        serving, predictor = export_classifier(config, reviews, directory)
        rows = [measure(serving, predictor, reviews, batch, args.repeats) for batch in args.batch_sizes]
    measurement.print_table(
        rows,
        [
            ("batch", "batch", "{}"),
            ("tokens_in_batch", "padded tokens", "{}"),
            ("saved_model_ms", "SavedModel ms", "{:.2f}"),
            ("onnx_runtime_ms", "ONNX Runtime ms", "{:.2f}"),
            ("onnx_session_only_ms", "ORT session only ms", "{:.2f}"),
            ("onnx_over_saved_model", "ORT / SavedModel", "{:.2f}"),
            ("max_abs_probability_difference", "max |dp|", "{:.1e}"),
        ],
    )
    payload = {"config": {**{k: v for k, v in vars(args).items() if k != "output"}, "model": config.to_dict()}}
    measurement.write_results("export_latency" + ("_smoke" if args.smoke else ""), {**payload, "rows": rows}, args.output)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
