"""`pipelines.main_job --attention <family>` in --smoke size for every registered attention family:
train, save and reload the classifier, export and verify the SavedModel and the ONNX bundle.

One seed per family (`--seeds 1`): the seeds' spread is the main job's, proved once in
tests/test_train_imdb_smoke.py, whose end-to-end run is also the default family's (dense) run
of the checks below (`assert_family_run`)."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from export.imdb import onnx_bundle
from keras_attn import LinearAttention
from keras_attn import TransformerEncoder
from keras_attn.attention_families import FAMILIES
from pipelines import main_job
from pipelines import train_imdb
from tests.imdb_fixtures import smoke_args

pytestmark = pytest.mark.slow


def assert_family_run(family, summary, run_dir, tmp_path):
    """The checks of a main job run with `--attention family` whose summary is `summary`."""
    training = json.loads((run_dir / "summary.json").read_text())
    assert training["model"]["attention"] == summary["attention"] == family
    assert f"<tr><th>attention family</th><td>{family}</td></tr>" in (run_dir / "report.html").read_text()
    # The encoder block runs the family's layer, and a saved model reloads with it and its outputs.
    config = train_imdb.SentimentClassifierConfig.from_dict(training["model"])
    model = train_imdb.build_sentiment_classifier(config)
    assert type(model.get_layer("encoder_0").self_attention) is FAMILIES[family]
    model.save(tmp_path / "classifier.keras")
    reloaded = keras.saving.load_model(tmp_path / "classifier.keras")
    assert type(reloaded.get_layer("encoder_0").self_attention) is FAMILIES[family]
    ids = np.random.default_rng(0).integers(2, config.vocabulary_size, (3, 40)).astype("int32")
    ids[1, 25:] = 0
    np.testing.assert_allclose(reloaded(ids), model(ids), atol=1e-6)
    # The exported SavedModel and ONNX model agree with the trained Keras model.
    exports = summary["exports"]
    for key in ("savedmodel_fresh_process_max_abs_diff", "saved_model_cli_max_abs_diff", "onnx_max_abs_diff"):
        assert exports["parity"][key] <= 1e-5
    serve = tf.saved_model.load(exports["savedmodel"]).signatures["serving_default"]
    assert serve(reviews=tf.constant(["A fine film.", ""]))["label"].shape == (2,)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {train_imdb.SentimentClassifierConfig.attention}))
def test_every_other_family_trains_reloads_and_exports(family, small_imdb_archive, imdb_cache_dir, tmp_path):
    """Over a minute a family: a training, the export, two fresh TensorFlow processes (the
    SavedModel's verification) and the ONNX conversions, which are what each family must pass."""
    run_dir, export_dir = tmp_path / "run", tmp_path / "export"
    args = ["--epochs", "1", "--seeds", "1", "--attention", family, "--export-dir", str(export_dir)]
    summary = main_job.main(smoke_args(small_imdb_archive, imdb_cache_dir, run_dir, *args))
    assert_family_run(family, summary, run_dir, tmp_path)


def test_an_unknown_family_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_imdb.parse_args(["--attention", "sparse"])
    assert exit_info.value.code == 2
    assert (
        "`attention` must be one of ['dense', 'linear', 'linformer', 'lsh']. Received: attention='sparse'"
        in capsys.readouterr().err
    )


class _NoOnnxAttention(LinearAttention):
    """A family that declares it does not export to ONNX."""

    capabilities = dataclasses.replace(
        LinearAttention.capabilities, onnx=False, reasons=(("onnx", "Its kernels have no ONNX form."),)
    )


def test_the_onnx_bundle_refuses_a_family_that_declares_no_onnx_naming_it(tmp_path):
    token_ids = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(50, 8)(token_ids)
    hidden = TransformerEncoder(16, 2, self_attention=_NoOnnxAttention(2, 4))(hidden)
    model = keras.Model(token_ids, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(hidden)))
    message = r"_NoOnnxAttention does not support onnx .* Its kernels have no ONNX form\. Received: an ONNX export"
    with pytest.raises(ValueError, match=message):
        onnx_bundle.write_onnx_bundle(model, tmp_path / "vocabulary.txt", 50, 16, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
