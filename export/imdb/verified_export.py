"""The IMDB classifier's export with verification: nothing is published unless every export agrees with Keras.

`export_and_verify` builds the SavedModel and the ONNX bundle in staging directories, then
compares, on the same raw reviews, the Keras model with:

1. the SavedModel reloaded in a fresh Python process that imports TensorFlow only (no project
   code: the process checks that none of its modules got imported);
2. `saved_model_cli run` on the same SavedModel;
3. the ONNX model in onnxruntime through the bundle's own predictor (its token ids must equal
   the training vectoriser's exactly), and the same with the bundle's fused-attention model
   (`model.fused.onnx`) where the bundle has one (dense attention).

Probabilities must agree within `atol` (1e-5) and labels exactly (away from 0.5). The bundle's
int8 model (`model.int8.onnx`) cannot keep that parity (its weights are rounded to 256 levels),
so it is checked by accuracy instead (`verify_int8_accuracy`): on labelled reviews the caller
passes (the main job's validation slice, never the test set) it may lose at most
`INT8_TOLERANCE_POINTS` accuracy points against the float Keras model. If any check fails,
`ExportVerificationError` is raised and the staging directories are removed. Only then are
both renamed into place (new version numbers, never overwriting) and `models.config` updated.
"""

import math
import numbers
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

import keras_attn
from export import serving_layout
from export.fresh_process import ExportVerificationError
from export.fresh_process import serve_in_fresh_process
from export.imdb import onnx_bundle
from export.imdb import savedmodel
from export.imdb.onnx_predictor import FUSED_MODEL_FILE
from export.imdb.onnx_predictor import MODEL_FILES
from export.imdb.onnx_predictor import OnnxSentimentPredictor
from models.export_manifest import write_manifest
from models.imdb_text import MODEL_ID
from models.imdb_text import dense_token_ids

ATOL = 1e-5
INT8_TOLERANCE_POINTS = 0.3  # accuracy points the int8 ONNX model may lose against the float Keras model
_ACCURACY_BATCH = 64  # reviews per model call in the accuracy check (attention memory grows with it)


def verification_reviews(reviews, count=12):
    """`count` reviews spread over the length range (shortest to longest) plus edge cases."""
    by_length = sorted(reviews, key=len)
    picks = [by_length[round(i * (len(by_length) - 1) / (count - 1))] for i in range(count)]
    return picks + ["", "!!! ... ???", "<br /><br />GREAT<br />"]


def keras_reference(model, vectorizer, sequence_length, reviews):
    """Token ids (as the training pipeline makes them) and the Keras probabilities."""
    ids = dense_token_ids(tf.constant(reviews), vectorizer, sequence_length)
    probability = np.asarray(model(ids, training=False)).reshape(-1)
    return ids.numpy(), probability


def run_fresh_process(saved_model_dir, reviews):
    """Serves `reviews` from the SavedModel in a new interpreter with TensorFlow only."""
    outputs = serve_in_fresh_process(saved_model_dir, {savedmodel.INPUT_NAME: list(reviews)})
    return np.asarray(outputs["probability"], np.float32), np.asarray(outputs["label"])


def run_saved_model_cli(saved_model_dir, reviews):
    """Serves `reviews` with `saved_model_cli run` (inputs from a .npy file: reviews hold `;`)."""
    cli = Path(sys.executable).with_name("saved_model_cli")
    with tempfile.TemporaryDirectory() as scratch:
        inputs = Path(scratch) / "reviews.npy"
        np.save(inputs, np.array([review.encode("utf-8") for review in reviews], dtype=object))
        command = [
            str(cli),
            "run",
            "--dir",
            str(saved_model_dir),
            "--tag_set",
            "serve",
            "--signature_def",
            serving_layout.SIGNATURE,
            "--inputs",
            f"{savedmodel.INPUT_NAME}={inputs}",
            "--outdir",
            str(Path(scratch) / "out"),
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise ExportVerificationError(f"saved_model_cli run failed:\n{result.stderr[-4000:]}")
        out = Path(scratch) / "out"
        return np.load(out / "probability.npy"), np.load(out / "label.npy")


def compare(name, probability, label, expected, atol):
    """Max abs probability difference against `expected`; raises if above `atol` or a label differs.

    Labels are compared where Keras is more than `atol` away from the 0.5 threshold (closer to
    it, a difference within tolerance may legitimately flip the label).
    """
    probability = np.asarray(probability, np.float64).reshape(-1)
    if probability.shape != expected.shape:
        raise ExportVerificationError(f"{name}: {probability.shape[0]} outputs for {expected.shape[0]} reviews")
    difference = float(np.max(np.abs(probability - expected)))
    if not difference <= atol:
        raise ExportVerificationError(f"{name}: probabilities differ from Keras by {difference:.3g} > {atol}")
    decided = np.abs(expected - 0.5) > atol
    if not np.array_equal(np.asarray(label).reshape(-1)[decided], (expected[decided] >= 0.5).astype(np.int64)):
        raise ExportVerificationError(f"{name}: labels differ from Keras")
    return difference


def verify_exports(model, vectorizer, sequence_length, saved_model_dir, onnx_dir, reviews, atol=ATOL):
    """Compares both exports with Keras on `reviews`; returns the parity figures or raises."""
    ids, expected = keras_reference(model, vectorizer, sequence_length, reviews)
    expected = expected.astype(np.float64)
    predictor = OnnxSentimentPredictor(onnx_dir)
    onnx_ids = predictor.token_ids(reviews)
    if not np.array_equal(onnx_ids, ids):
        rows = [i for i in range(len(reviews)) if i >= len(onnx_ids) or not np.array_equal(onnx_ids[i], ids[i])]
        raise ExportVerificationError(f"ONNX predictor tokenises reviews {rows} differently from training")
    onnx_outputs = predictor.predict(reviews)
    figures = {
        "reviews": len(reviews),
        "token_lengths": [int(n) for n in np.count_nonzero(ids, axis=1)],
        "atol": atol,
        "savedmodel_fresh_process_max_abs_diff": compare(
            "SavedModel (fresh process)", *run_fresh_process(saved_model_dir, reviews), expected, atol
        ),
        "saved_model_cli_max_abs_diff": compare(
            "saved_model_cli", *run_saved_model_cli(saved_model_dir, reviews), expected, atol
        ),
        "onnx_max_abs_diff": compare(
            "ONNX Runtime", onnx_outputs["probability"], onnx_outputs["label"], expected, atol
        ),
    }
    if (Path(onnx_dir) / FUSED_MODEL_FILE).is_file():  # the figure is absent where the bundle has no fused model
        fused = OnnxSentimentPredictor(onnx_dir, fused=True).predict(reviews)
        figures["onnx_fused_max_abs_diff"] = compare(
            "ONNX Runtime, fused attention", fused["probability"], fused["label"], expected, atol
        )
    return figures


def _labelled(reviews, labels):
    """`(reviews as a list, labels as an int64 array)` once they are a non-empty list of strings
    and as many 0/1 labels; else a `ValueError` naming the argument and the value."""
    reviews = list(reviews)
    if not reviews:
        raise ValueError(f"`accuracy_reviews` must be a non-empty list of str. Received: accuracy_reviews={reviews!r}")
    for index, review in enumerate(reviews):
        if not isinstance(review, str):
            raise ValueError(
                f"`accuracy_reviews` must be a list of str. Received: accuracy_reviews[{index}]={review!r} "
                f"({type(review).__name__})"
            )
    array = np.asarray(labels)
    if array.shape != (len(reviews),) or not np.isin(array, (0, 1)).all():
        raise ValueError(
            f"`accuracy_labels` must hold one 0/1 label per review ({len(reviews)}). "
            f"Received: accuracy_labels={array.tolist()[:10]!r} (shape {array.shape})"
        )
    return reviews, array.astype(np.int64)


def _check_tolerance(tolerance):
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not math.isfinite(tolerance):
        raise ValueError(
            f"`int8_tolerance` must be a finite number of accuracy points. Received: int8_tolerance={tolerance!r}"
        )
    return float(tolerance)


def verify_int8_accuracy(
    model, vectorizer, sequence_length, onnx_dir, reviews, labels, tolerance=INT8_TOLERANCE_POINTS
):
    """Checks the bundle's int8 ONNX model by accuracy against the float Keras model; returns the figures or raises.

    The int8 model's probabilities differ from the float model's by far more than the float
    exports' 1e-5 parity, so parity is no test for it: what must hold is that it classifies
    `reviews` (raw strings, labelled by `labels`, 0/1) about as well. Its accuracy there, in
    points (percent), may be at most `tolerance` below the Keras model's on the same reviews
    (a negative `tolerance` demands a gain); both label a review positive at probability >= 0.5.
    The reviews go in batches of 64 of similar length: the int8 model's activation scales are
    computed per batch, so its figure is that of batches like a server's, not of one review alone.

    Returns:
        `{"reviews", "tolerance_points", "float_keras_accuracy", "int8_onnx_accuracy",
        "points_lost", "float_onnx_bytes", "int8_onnx_bytes", "size_ratio"}`.

    Raises:
        ExportVerificationError: naming the int8 file and both accuracies.
    """
    reviews, labels = _labelled(reviews, labels)
    tolerance = _check_tolerance(tolerance)
    predictor = OnnxSentimentPredictor(onnx_dir, quantized=True)
    # Batches of reviews of similar length: a batch is padded to its longest review, so mixing
    # lengths would spend most of the time on padding.
    order = sorted(range(len(reviews)), key=lambda index: len(reviews[index]))
    float_correct = int8_correct = 0
    for start in range(0, len(order), _ACCURACY_BATCH):
        batch = [reviews[index] for index in order[start : start + _ACCURACY_BATCH]]
        expected = labels[order[start : start + _ACCURACY_BATCH]]
        float_correct += int(np.sum((keras_reference(model, vectorizer, sequence_length, batch)[1] >= 0.5) == expected))
        int8_correct += int(np.sum(predictor.predict(batch)["label"] == expected))
    float_accuracy, int8_accuracy = float_correct / len(reviews), int8_correct / len(reviews)
    points_lost = 100 * (float_correct - int8_correct) / len(reviews)  # from counts: a loss at the tolerance passes
    float_path = Path(onnx_dir) / MODEL_FILES[False]
    if points_lost > tolerance:
        raise ExportVerificationError(
            f"{predictor.model_path}: int8 ONNX accuracy {int8_accuracy:.2%} on {len(reviews)} labelled reviews is "
            f"{points_lost:.2f} points below the float Keras model's {float_accuracy:.2%} "
            f"(tolerance {tolerance:g} points); nothing was published"
        )
    return {
        "reviews": len(reviews),
        "tolerance_points": tolerance,
        "float_keras_accuracy": float_accuracy,
        "int8_onnx_accuracy": int8_accuracy,
        "points_lost": points_lost,
        "float_onnx_bytes": float_path.stat().st_size,
        "int8_onnx_bytes": predictor.model_path.stat().st_size,
        "size_ratio": predictor.model_path.stat().st_size / float_path.stat().st_size,
    }


def export_and_verify(
    model,
    vectorizer,
    vocabulary_path,
    sequence_length,
    reviews,
    export_dir,
    model_name="imdb_sentiment",
    atol=ATOL,
    *,
    accuracy_reviews,
    accuracy_labels,
    int8_tolerance=INT8_TOLERANCE_POINTS,
):
    """Writes, verifies and publishes the SavedModel and the ONNX bundle (float, int8 and fused-attention models).

    Args:
        model: the trained token-id classifier.
        vectorizer: the training `TextVectorization` (the reference tokenisation).
        vocabulary_path: its vocabulary file.
        sequence_length: the training truncation length.
        reviews: raw reviews to compare on (see `verification_reviews`).
        export_dir: root of the TF Serving layout.
        model_name: the served model's name.
        atol: max abs probability difference allowed.
        accuracy_reviews: labelled raw reviews for the int8 model's accuracy check (held-out
            data such as the validation slice; never the test set, whose figure must stay unbiased).
        accuracy_labels: their 0/1 labels.
        int8_tolerance: accuracy points the int8 ONNX model may lose against the float Keras
            model on them (`verify_int8_accuracy`).

    Returns:
        `{"savedmodel": path, "onnx": path, "models_config": path, "parity": {...}, "int8": {...}}`.
    """
    serving_layout.check_model_name(model_name)
    accuracy_reviews, accuracy_labels = _labelled(accuracy_reviews, accuracy_labels)
    _check_tolerance(int8_tolerance)  # bad arguments fail before any export is written
    export_dir = Path(export_dir).resolve()
    with (
        serving_layout.staging_directory(export_dir / model_name) as saved_staging,
        serving_layout.staging_directory(export_dir / "onnx" / model_name) as onnx_staging,
    ):
        savedmodel.write_savedmodel(
            model, vocabulary_path, vectorizer.vocabulary_size(), sequence_length, saved_staging
        )
        warmup_batches = [reviews[:1], reviews[:8]]  # one review alone, then a batch
        serving_layout.write_warmup_requests(saved_staging, model_name, savedmodel.INPUT_NAME, warmup_batches)
        onnx_bundle.write_onnx_bundle(
            model, vocabulary_path, vectorizer.vocabulary_size(), sequence_length, onnx_staging
        )
        sizes = {"reviews": vectorizer.vocabulary_size()}
        write_manifest(saved_staging, MODEL_ID, "savedmodel", sizes, keras_attn.__version__, savedmodel.INPUT_NAME)
        parity = verify_exports(model, vectorizer, sequence_length, saved_staging, onnx_staging, reviews, atol)
        int8 = verify_int8_accuracy(
            model, vectorizer, sequence_length, onnx_staging, accuracy_reviews, accuracy_labels, int8_tolerance
        )
        saved_path = serving_layout.publish(saved_staging, export_dir / model_name)
        onnx_path = serving_layout.publish(onnx_staging, export_dir / "onnx" / model_name)
    return {
        "savedmodel": str(saved_path),
        "onnx": str(onnx_path),
        "models_config": str(serving_layout.write_models_config(export_dir)),
        "parity": parity,
        "int8": int8,
    }
