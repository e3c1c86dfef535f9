"""A model taking packed rows (token ids and `segment_ids`) exports to SavedModel and ONNX (issue #39, item 8).

The model is Functional: an embedding, a `TransformerEncoder` called with the segment ids, a dense head. Oracles: the
Keras model with the same weights on packed rows (documents of several lengths, padding, a row of padding only),
against the SavedModel served in a fresh process without project code (`export.fresh_process`, whose requests are
strings: rows of ids written as text), `saved_model_cli run` on the integer signature, and onnxruntime on the model
converted as every export converts (`export.onnx_conversion.convert`). The exports must also keep the documents apart:
each document's outputs equal the Keras model's on the document alone.
"""

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnxruntime
import pytest
import tensorflow as tf

from export.fresh_process import serve_in_fresh_process
from export.onnx_conversion import convert
from keras_attn import TransformerEncoder
from tests.test_onnx_fused_attention import with_random_weights

ATOL = 1e-4  # the exports' parity bound (tests/test_onnx_fused_attention.py)
VOCABULARY, WIDTH, OUTPUTS = 30, 8, 3
TOKEN_IDS = np.array(
    [[5, 8, 2, 9, 4, 4, 7, 1, 3, 0], [6, 6, 2, 8, 0, 0, 0, 0, 0, 0], [0] * 10], "int32"
)  # the last row: padding only
SEGMENT_IDS = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 0], [4, 4, 4, 4, 0, 0, 0, 0, 0, 0], [0] * 10], "int32")
INTEGER_SIGNATURE = [
    tf.TensorSpec([None, None], tf.int32, name="token_ids"),
    tf.TensorSpec([None, None], tf.int32, name="segment_ids"),
]
TEXT_SIGNATURE = [tf.TensorSpec([None], tf.string, name=spec.name) for spec in INTEGER_SIGNATURE]


def packed_model():
    keras.utils.set_random_seed(21)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    segments = keras.Input((None,), dtype="int32", name="segment_ids")
    x = keras.layers.Embedding(VOCABULARY, WIDTH)(tokens)
    x = TransformerEncoder(16, 2)(x, segment_ids=segments)
    return with_random_weights(keras.Model([tokens, segments], keras.layers.Dense(OUTPUTS)(x)))


def as_text(rows):
    """Rows of ids as the text requests of the fresh-process server: `"5 8 2 0"` per row."""
    return [" ".join(str(value) for value in row) for row in rows]


def write_savedmodel(model, path):
    """`serving_default` takes the int32 `token_ids` and `segment_ids`; `serve_text` the same rows as text."""

    def serve(token_ids, segment_ids):
        return {"outputs": model([token_ids, segment_ids], training=False)}

    def serve_text(token_ids, segment_ids):
        ids = (tf.strings.to_number(tf.strings.split(rows), tf.int32).to_tensor() for rows in (token_ids, segment_ids))
        return serve(*ids)

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve, input_signature=INTEGER_SIGNATURE)
    archive.add_endpoint("serve_text", serve_text, input_signature=TEXT_SIGNATURE)
    archive.write_out(str(path), verbose=False)
    return path


def saved_model_cli_outputs(path):
    """`saved_model_cli run` on `serving_default`, its int32 inputs from .npy files."""
    inputs = []
    for name, array in (("token_ids", TOKEN_IDS), ("segment_ids", SEGMENT_IDS)):
        np.save(path.parent / f"{name}.npy", array)
        inputs.append(f"{name}={path.parent / name}.npy")
    cli, out = Path(sys.executable).with_name("saved_model_cli"), path.parent / "cli"
    command = [str(cli), "run", "--dir", str(path), "--tag_set", "serve", "--signature_def", "serving_default"]
    result = subprocess.run(
        [*command, "--inputs", ";".join(inputs), "--outdir", str(out)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out / "outputs.npy")


def onnx_outputs(model, path):
    convert(
        tf.function(
            lambda tokens, segments: model([tokens, segments], training=False), input_signature=INTEGER_SIGNATURE
        ),
        path,
    )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"token_ids": TOKEN_IDS, "segment_ids": SEGMENT_IDS})[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = packed_model()
    directory = tmp_path_factory.mktemp("packed_export")
    saved_model = write_savedmodel(model, directory / "savedmodel")
    expected = np.asarray(model([TOKEN_IDS, SEGMENT_IDS], training=False))
    return model, saved_model, directory, expected


def assert_documents_apart(model, outputs):
    """Each document's outputs equal the Keras model's on the document alone in its own row."""
    for row, row_ids in enumerate(SEGMENT_IDS):
        for document in set(row_ids.tolist()) - {0}:
            (positions,) = np.nonzero(row_ids == document)
            alone = model([TOKEN_IDS[row : row + 1, positions], np.ones((1, positions.size), "int32")])
            np.testing.assert_allclose(outputs[row, positions], np.asarray(alone)[0], atol=ATOL, rtol=0)


def test_the_keras_model_keeps_the_documents_apart(exported):
    model, _, _, expected = exported
    assert_documents_apart(model, expected)


def test_the_savedmodel_served_in_a_fresh_process_matches_keras(exported):
    model, saved_model, _, expected = exported
    served = serve_in_fresh_process(
        saved_model, {"token_ids": as_text(TOKEN_IDS), "segment_ids": as_text(SEGMENT_IDS)}, signature="serve_text"
    )
    outputs = np.asarray(served["outputs"], "float32")
    np.testing.assert_allclose(outputs, expected, atol=ATOL, rtol=0)
    assert_documents_apart(model, outputs)


def test_saved_model_cli_runs_the_integer_signature_like_keras(exported):
    _, saved_model, _, expected = exported
    np.testing.assert_allclose(saved_model_cli_outputs(saved_model), expected, atol=ATOL, rtol=0)


def test_onnx_runtime_matches_keras_on_packed_rows(exported):
    model, _, directory, expected = exported
    outputs = onnx_outputs(model, directory / "packed.onnx")
    np.testing.assert_allclose(outputs, expected, atol=ATOL, rtol=0)
    assert_documents_apart(model, outputs)
