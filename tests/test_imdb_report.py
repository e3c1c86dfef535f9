"""`runs/imdb/report.html`: figures, confusion matrix and attention examples, self-contained."""

import base64
import html
import io
import re

import numpy as np
import pytest
import tensorflow as tf
from matplotlib import image

from keras_attn.visualization.explorer import decode_weights
from keras_attn.visualization.explorer import embedded_data
from models import imdb_text
from models.review_attention import explain_review
from pipelines import imdb_ablation
from pipelines import imdb_report
from tests.browser import broken_images
from tests.browser import open_page
from tests.imdb_fixtures import TINY_RUN_TEXTS as TEXTS

LABELS = [1, 0, 0, 1]  # the tiny model gets some right and some wrong
SUMMARY = {
    "test_accuracy": 0.5,
    "test_accuracy_by_branch": {"attention": 0.25, "ngram": 0.75},
    "validation_accuracy": 0.6,
    "attention": "dense",
    "seed": 1337,
    "epochs_run": 2,
    "training_seconds": 12.5,
    "train_examples_per_second": 40.0,
    "data": {"source": "tiny", "test": 4},
    "exports": {
        "parity": {"reviews": 4, "onnx_max_abs_diff": 1.2e-7, "saved_model_cli_max_abs_diff": 6e-8},
        "int8": {
            "reviews": 2500,
            "tolerance_points": 0.3,
            "float_keras_accuracy": 0.9096,
            "int8_onnx_accuracy": 0.9084,
            "points_lost": 0.12,
            "float_onnx_bytes": 7708229,
            "int8_onnx_bytes": 2114966,
            "size_ratio": 0.2744,
        },
    },
}
HISTORY = [
    {
        "epoch": float(e),
        "loss": 1.0 - 0.1 * e,
        "attention_accuracy": 0.5 + 0.1 * e,
        "val_loss": 1.1 - 0.1 * e,
        "val_attention_accuracy": 0.5 + 0.05 * e,
    }
    for e in range(3)
]


@pytest.fixture(scope="module")
def report(tiny_imdb_run, tmp_path_factory):
    _, model, vectorizer, config = tiny_imdb_run
    path = tmp_path_factory.mktemp("report") / "report.html"
    reviews = tf.data.Dataset.from_tensor_slices((TEXTS, LABELS))
    matrix = imdb_report.write_report(path, SUMMARY, HISTORY, model, vectorizer, config, reviews, batch_size=2)
    return path, matrix, model, vectorizer, config


def test_confusion_matrix_counts_every_test_review(report):
    _, matrix, model, vectorizer, config = report
    probabilities = [float(model(imdb_text.dense_token_ids([t], vectorizer, config.max_tokens))[0, 0]) for t in TEXTS]
    expected = np.zeros((2, 2), int)
    for label, probability in zip(LABELS, probabilities):
        expected[label, int(probability >= 0.5)] += 1
    np.testing.assert_array_equal(matrix, expected)


def test_report_is_self_contained_with_figures_and_the_examples_maps(report):
    path, matrix, model, vectorizer, config = report
    page = path.read_text()
    assert "://" not in page.replace("data:image/png;base64,", "")
    assert not re.search(r'\b(src|href)\s*=\s*"(?!data:image/png;base64,)', page)
    assert "0.5000" in page and "1.20e-07" in page and "attention branch" in page
    int8_rows = re.search(r"int8 ONNX model \(checked by accuracy.*?</table>", page, re.S).group(0)
    for shown in (
        "2,500 validation reviews",
        "0.9096",
        "7,708,229",
        "0.9084",
        "2,114,966 (0.27x)",
        "0.12 (at most 0.3)",
    ):
        assert shown in int8_rows
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(pngs) == 2  # learning curves, confusion matrix
    for encoded, size in zip(pngs, [(400, 1100), (360, 400)]):
        pixels = image.imread(io.BytesIO(base64.b64decode(encoded)), format="png")
        assert pixels.shape[:2] == size and pixels[..., :3].std() > 0.01
    layers = embedded_data(page)["layers"]
    explained = [explain_review(model, vectorizer, config, text) for text in TEXTS]
    right = [(e.probability >= 0.5) == bool(label) for e, label in zip(explained, LABELS)]
    shown = [i for i in range(len(TEXTS)) if right[i]][:2] + [i for i in range(len(TEXTS)) if not right[i]][:2]
    expected_names, expected_maps = [], []
    for number, index in enumerate(shown, start=1):
        verdict = "right" if right[index] else "wrong"
        expected_names += [f"review {number} ({verdict}) | {m.name}" for m in explained[index].maps]
        expected_maps += explained[index].maps
    assert [layer["name"] for layer in layers] == expected_names
    for layer, attention_map in zip(layers, expected_maps):
        np.testing.assert_array_equal(decode_weights(layer), attention_map.weights)


def test_report_shows_the_ablation_under_this_runs_figures(report):
    path, *_ = report
    table = re.search(r"Ablation of the attention branch.*?</table>", path.read_text(), re.S).group(0)
    header, *rows = re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", table)
    assert header[0] == imdb_ablation.HEADER[0]
    assert rows[0] == ("this run (seed 1337)", "<td>25.00 %</td><td>50.00 %</td><td></td>")
    expected = [tuple(html.escape(cell) for cell in imdb_ablation.cells(row)) for row in imdb_ablation.ROWS]
    shown = [(name, *re.findall(r"<td>(.*?)</td>", cells)) for name, cells in rows[1:]]
    assert shown == expected


def test_report_opens_in_chromium_without_errors_or_broken_images(report):
    path, *_ = report
    layers = embedded_data(path.read_text())["layers"]
    with open_page(path) as page:
        assert broken_images(page) == []
        assert page.evaluate("Array.from(document.images).map(i => i.naturalWidth)") == [1100, 400]
        assert page.locator("#layer option").count() == len(layers)
        last = len(layers) - 1
        page.select_option("#layer", str(last))
        page.select_option("#head", "1")
        cell = page.evaluate("state.cell")
        page.locator("#map").hover(position={"x": 0.5 * cell, "y": 0.5 * cell})
        expected = decode_weights(layers[last])[1, 0, 0]
        assert float(page.locator("#hover").get_attribute("data-value")) == float(expected)
