import dataclasses
import json
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf

from export import serving_layout
from export import verify
from export.imdb import onnx_predictor
from export.imdb import verified_export
from export.imdb.onnx_predictor import OnnxSentimentPredictor
from export.onnx_fused_attention import fused_attention_count
from models import imdb_text
from pipelines import imdb_data
from pipelines import translate
from tests.imdb_fixtures import TINY_CLASSIFIER
from tests.imdb_fixtures import train_small
from tests.serving_checks import warmup_requests

ODD_REVIEWS = [
    "",
    "   ",
    "<br /><br />",
    "ÉLAN élan Straße naïve 10/10 — “quoted” ¡wow!",
    "tabs\tand\nnew\rlines\x0bvertical\x0cfeed\u00a0nbsp\u2003em-space\u0085nel",
    "UPPER lower MiXeD don't can't won't",
]


def accuracy_check(trained):
    """The int8 accuracy check's arguments, as the main job passes them (the validation slice)."""
    return {"accuracy_reviews": trained.validation[0], "accuracy_labels": trained.validation[1]}


@pytest.fixture(scope="module")
def exported(trained_imdb, tmp_path_factory):
    export_dir = tmp_path_factory.mktemp("export")
    reviews = verified_export.verification_reviews(trained_imdb.test_reviews)
    result = verified_export.export_and_verify(
        trained_imdb.model,
        trained_imdb.vectorizer,
        trained_imdb.vocabulary,
        TINY_CLASSIFIER.max_tokens,
        reviews,
        export_dir,
        int8_tolerance=100.0,  # a few steps of training: the check's figures are tested, not the tiny model's loss
        **accuracy_check(trained_imdb),
    )
    return export_dir, reviews, result


def keras_probabilities(trained, reviews):
    return verified_export.keras_reference(trained.model, trained.vectorizer, TINY_CLASSIFIER.max_tokens, reviews)[1]


def test_tf_serving_layout(exported, trained_imdb):
    export_dir, reviews, result = exported
    version = export_dir / "imdb_sentiment" / "1"
    assert result["savedmodel"] == str(version)
    assert (version / "saved_model.pb").is_file() and (version / "variables").is_dir()
    assert (version / "assets" / "vocabulary.txt").read_text() == trained_imdb.vocabulary.read_text()
    config = (export_dir / "models.config").read_text()
    assert 'name: "imdb_sentiment"' in config and f'base_path: "{version.parent.resolve()}"' in config
    assert "onnx" not in config
    assert not list(export_dir.rglob(".staging-*"))
    assert version.stat().st_mode & 0o755 == 0o755  # readable by a server running as another user


def test_warmup_records_are_predict_requests_on_raw_reviews(exported):
    export_dir, reviews, _ = exported
    requests = warmup_requests(export_dir / "imdb_sentiment" / "1", "reviews")
    assert requests == [("imdb_sentiment", "serving_default", batch) for batch in (reviews[:1], reviews[:8])]


def test_serving_signature_answers_raw_strings(exported, trained_imdb):
    export_dir, _, _ = exported
    serve = tf.saved_model.load(str(export_dir / "imdb_sentiment" / "1")).signatures["serving_default"]
    (spec,) = serve.structured_input_signature[1].values()
    assert spec.dtype == tf.string and spec.shape.as_list() == [None]
    reviews = trained_imdb.test_reviews[:5] + ODD_REVIEWS
    outputs = serve(reviews=tf.constant(reviews))
    expected = keras_probabilities(trained_imdb, reviews)
    np.testing.assert_allclose(outputs["probability"].numpy(), expected, atol=1e-5)
    assert outputs["label"].dtype == tf.int64
    np.testing.assert_array_equal(outputs["label"].numpy(), (outputs["probability"].numpy() >= 0.5).astype(np.int64))


def test_parity_figures_are_reported_within_tolerance(exported):
    _, reviews, result = exported
    parity = result["parity"]
    assert parity["reviews"] == len(reviews)
    assert max(parity["token_lengths"]) == TINY_CLASSIFIER.max_tokens and min(parity["token_lengths"]) == 0
    for key in (
        "savedmodel_fresh_process_max_abs_diff",
        "saved_model_cli_max_abs_diff",
        "onnx_max_abs_diff",
        "onnx_fused_max_abs_diff",
    ):
        assert 0.0 <= parity[key] <= 1e-5


def test_onnx_model_has_dynamic_batch_and_length(exported, trained_imdb):
    export_dir, _, _ = exported
    bundle = export_dir / "onnx" / "imdb_sentiment" / "1"
    model = onnx.load(str(bundle / "model.onnx"))
    assert max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx")) <= 18
    (graph_input,) = model.graph.input
    assert [dim.HasField("dim_value") for dim in graph_input.type.tensor_type.shape.dim] == [False, False]
    predictor = OnnxSentimentPredictor(bundle)
    for reviews in (trained_imdb.test_reviews[:1], trained_imdb.test_reviews[10:13], ODD_REVIEWS):
        np.testing.assert_allclose(
            predictor.predict(reviews)["probability"], keras_probabilities(trained_imdb, reviews), atol=1e-5
        )


def test_onnx_tokenisation_equals_training_on_every_review(exported, trained_imdb):
    export_dir, _, _ = exported
    predictor = OnnxSentimentPredictor(export_dir / "onnx" / "imdb_sentiment" / "1")
    reviews = trained_imdb.test_reviews + ODD_REVIEWS
    expected = imdb_text.dense_token_ids(tf.constant(reviews), trained_imdb.vectorizer, TINY_CLASSIFIER.max_tokens)
    np.testing.assert_array_equal(predictor.token_ids(reviews), expected.numpy())
    # The serving helper itself against the training pipeline's ids (imdb_data.token_ids).
    labelled = tf.data.Dataset.from_tensor_slices((reviews, [0] * len(reviews)))
    training = imdb_data.token_ids(labelled, trained_imdb.vectorizer, TINY_CLASSIFIER.max_tokens)
    training_ids = [ids for ids, _ in training.as_numpy_iterator()]
    for row, ids in zip(expected.numpy(), training_ids):
        np.testing.assert_array_equal(row[: len(ids)], ids)
        assert np.all(row[len(ids) :] == imdb_text.PADDING_ID)


def test_onnx_bundle_runs_without_project_code(exported, trained_imdb, tmp_path):
    export_dir, _, _ = exported
    bundle = export_dir / "onnx" / "imdb_sentiment" / "1"
    reviews = trained_imdb.test_reviews[:4]
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import onnx_predictor; "
        "p = onnx_predictor.OnnxSentimentPredictor(sys.argv[1]).predict(json.loads(sys.argv[2])); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'export')]; "
        "print(json.dumps(p['probability'].tolist()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(bundle), json.dumps(reviews)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(json.loads(result.stdout), keras_probabilities(trained_imdb, reviews), atol=1e-5)


def test_export_never_overwrites_a_version(exported, trained_imdb):
    export_dir, reviews, _ = exported
    first = export_dir / "imdb_sentiment" / "1" / "saved_model.pb"
    before = (first.read_bytes(), first.stat().st_mtime_ns)
    result = verified_export.export_and_verify(
        trained_imdb.model,
        trained_imdb.vectorizer,
        trained_imdb.vocabulary,
        TINY_CLASSIFIER.max_tokens,
        reviews[:4],
        export_dir,
        int8_tolerance=100.0,
        **accuracy_check(trained_imdb),
    )
    assert result["savedmodel"] == str(export_dir / "imdb_sentiment" / "2")
    assert result["onnx"] == str(export_dir / "onnx" / "imdb_sentiment" / "2")
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before


def test_disagreeing_export_is_refused_and_removed(exported, trained_imdb, monkeypatch):
    export_dir, reviews, _ = exported
    published = sorted(p.name for p in (export_dir / "imdb_sentiment").iterdir())
    other = keras.models.clone_model(trained_imdb.model)
    other.set_weights([w * 1.01 for w in trained_imdb.model.get_weights()])
    write_onnx = verified_export.onnx_bundle.write_onnx_bundle
    monkeypatch.setattr(verified_export.onnx_bundle, "write_onnx_bundle", lambda model, *args: write_onnx(other, *args))
    with pytest.raises(verified_export.ExportVerificationError, match="ONNX Runtime: probabilities differ"):
        verified_export.export_and_verify(
            trained_imdb.model,
            trained_imdb.vectorizer,
            trained_imdb.vocabulary,
            TINY_CLASSIFIER.max_tokens,
            reviews[:6],
            export_dir,
            **accuracy_check(trained_imdb),
        )
    assert sorted(p.name for p in (export_dir / "imdb_sentiment").iterdir()) == published
    assert not list(export_dir.rglob(".staging-*"))


@pytest.mark.slow  # `make test` keeps the float model's refusal (test_disagreeing_export_is_refused_and_removed)
def test_a_fused_model_that_disagrees_is_refused_and_nothing_published(exported, trained_imdb, monkeypatch):
    export_dir, reviews, _ = exported
    published = sorted(p.name for p in (export_dir / "onnx" / "imdb_sentiment").iterdir())
    write_fused = verified_export.onnx_bundle.write_fused_attention_model

    def write_off_by_one_percent(float_model, fused_model):
        written = write_fused(float_model, fused_model)
        model = onnx.load(str(written))
        for tensor in model.graph.initializer:
            if tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims):
                tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor) * 1.01, tensor.name))
        onnx.save(model, str(written))
        return written

    monkeypatch.setattr(verified_export.onnx_bundle, "write_fused_attention_model", write_off_by_one_percent)
    with pytest.raises(
        verified_export.ExportVerificationError, match="ONNX Runtime, fused attention: probabilities differ"
    ):
        verified_export.export_and_verify(
            trained_imdb.model,
            trained_imdb.vectorizer,
            trained_imdb.vocabulary,
            TINY_CLASSIFIER.max_tokens,
            reviews[:6],
            export_dir,
            **accuracy_check(trained_imdb),
        )
    assert sorted(p.name for p in (export_dir / "onnx" / "imdb_sentiment").iterdir()) == published
    assert not list(export_dir.rglob(".staging-*"))


# Inputs a caller may hand either predictor: (ONNX predictor input, the same batch for the SavedModel).
PREDICTOR_INPUTS = {
    "bare string": ("A wonderful film.", [b"A wonderful film."]),
    "bare bytes": (b"A wonderful film.", [b"A wonderful film."]),
    "tuple": (("great", "awful"), [b"great", b"awful"]),
    "numpy array": (np.array(["great", "awful"]), [b"great", b"awful"]),
    "non-UTF-8 bytes": (
        [b"great \xff\xfe film", b"\xe9l\xe8ve GREAT\x80", b"latin-1 caf\xe9 awful"],
        [b"great \xff\xfe film", b"\xe9l\xe8ve GREAT\x80", b"latin-1 caf\xe9 awful"],
    ),
    "empty batch": ([], []),
}


@pytest.mark.parametrize("case", sorted(PREDICTOR_INPUTS))
def test_onnx_predictor_takes_what_the_savedmodel_takes(exported, case):
    export_dir, _, _ = exported
    onnx_input, batch = PREDICTOR_INPUTS[case]
    serve = tf.saved_model.load(str(export_dir / "imdb_sentiment" / "1")).signatures["serving_default"]
    expected = serve(reviews=tf.constant(batch, tf.string, shape=[len(batch)]))
    got = OnnxSentimentPredictor(export_dir / "onnx" / "imdb_sentiment" / "1").predict(onnx_input)
    assert got["probability"].shape == got["label"].shape == (len(batch),)
    np.testing.assert_allclose(got["probability"], expected["probability"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(got["label"], expected["label"].numpy())


def test_onnx_tokenisation_of_non_utf8_bytes_equals_training(exported, trained_imdb):
    export_dir, _, _ = exported
    reviews = [b"great \xff\xfe film", b"\xe9l\xe8ve GREAT\x80 the", b"caf\xe9 <br />awful!", b"\x80\x81\x82"]
    expected = imdb_text.dense_token_ids(tf.constant(reviews), trained_imdb.vectorizer, TINY_CLASSIFIER.max_tokens)
    predictor = OnnxSentimentPredictor(export_dir / "onnx" / "imdb_sentiment" / "1")
    np.testing.assert_array_equal(predictor.token_ids(reviews), expected.numpy())


@pytest.mark.parametrize(
    "texts, named",
    [
        (None, "texts=None"),
        (42, "texts=42"),
        (["ok", 3], "texts[1]"),
        (["ok", None], "texts[1]"),
        (np.array([["a"], ["b"]]), "texts=array"),
    ],
)
def test_onnx_predictor_rejects_what_is_not_text(exported, texts, named):
    export_dir, _, _ = exported
    predictor = OnnxSentimentPredictor(export_dir / "onnx" / "imdb_sentiment" / "1")
    with pytest.raises(TypeError, match=named.replace("[", r"\[")):
        predictor.predict(texts)


def _published_copy(exported, tmp_path):
    """A copy of the published export tree, to tamper with."""
    export_dir, _, _ = exported
    copy = tmp_path / "export"
    shutil.copytree(export_dir, copy)
    return copy


def _verify_fails(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify.main([str(path)])
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip()


def test_the_verify_command_proves_every_published_version(exported, capsys):
    export_dir, _, _ = exported
    verify.main([str(export_dir)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("ok ") and "imdb_sentiment" in line for line in lines)
    manifest = json.loads((export_dir / "imdb_sentiment" / "1" / "manifest.json").read_text())
    assert (
        manifest["vocabulary_sizes"]["reviews"]
        == len((export_dir / "imdb_sentiment" / "1" / "assets" / "vocabulary.txt").read_text().splitlines()) + 2
    )
    assert onnx_predictor.MODEL_ID == imdb_text.MODEL_ID  # the bundle's copy of the one id


def test_the_verify_command_checks_the_roots_models_config(exported, tmp_path, capsys):
    copy = _published_copy(exported, tmp_path)  # a copy's models.config still points at the original
    config = copy / "models.config"
    message = _verify_fails(copy, capsys)
    assert str(config) in message and f"not at '{copy / 'imdb_sentiment'}'" in message
    config.unlink()
    assert f"{config} is missing" in _verify_fails(copy, capsys)
    serving_layout.write_models_config(copy)
    verify.main([str(copy)])
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_a_truncated_variables_file_is_named(exported, tmp_path, capsys):
    copy = _published_copy(exported, tmp_path)
    (variables,) = (copy / "imdb_sentiment" / "1" / "variables").glob("variables.data-*")
    variables.write_bytes(variables.read_bytes()[:100])
    message = _verify_fails(copy / "imdb_sentiment" / "1", capsys)
    assert message.count("\n") == 0 and str(variables) in message and "truncated or altered" in message


def test_a_cut_vocabulary_or_a_changed_onnx_byte_is_refused_by_the_predictor(exported, tmp_path, capsys):
    copy = _published_copy(exported, tmp_path)
    bundle = copy / "onnx" / "imdb_sentiment" / "1"
    vocabulary = bundle / "vocabulary.txt"
    tokens = vocabulary.read_text().splitlines()
    vocabulary.write_text("\n".join(tokens[: len(tokens) // 2]) + "\n")  # cut, as in the issue (1,000 of 20,000)
    with pytest.raises(ValueError, match=re.escape(str(vocabulary))):
        OnnxSentimentPredictor(bundle)
    assert str(vocabulary) in _verify_fails(bundle, capsys)
    shutil.copyfile(exported[0] / "onnx" / "imdb_sentiment" / "1" / "vocabulary.txt", vocabulary)
    model = bundle / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=re.escape(str(model))):
        OnnxSentimentPredictor(bundle)


def test_an_imdb_export_given_to_the_translator_is_refused_in_one_line(exported, capsys):
    export_dir, _, _ = exported
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--export", str(export_dir / "imdb_sentiment"), "Hola."])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "is an export of imdb_sentiment, expected translator" in error


def test_the_signature_refuses_a_two_dimensional_batch_naming_the_shape(exported):
    export_dir, _, _ = exported
    serve = tf.saved_model.load(str(export_dir / "imdb_sentiment" / "1")).signatures["serving_default"]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"input_must_be_a_1d_batch_of_strings|not compatible with expected shape \[\?\]",
    ):
        serve(reviews=tf.constant([["a good film", "a bad film"]]))


def _bundle(exported):
    return exported[0] / "onnx" / "imdb_sentiment" / "1"


def test_the_bundle_holds_the_int8_model_in_its_manifest(exported):
    bundle = _bundle(exported)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert {"model.onnx", "model.int8.onnx"} <= set(manifest["files"])
    float_model, int8_model = (onnx.load(str(bundle / name)) for name in ("model.onnx", "model.int8.onnx"))
    # ONNX Runtime's dynamic quantisation: 8-bit weights (MatMul: int8; Gather: uint8) and the
    # integer MatMuls that take them; the float model has neither.
    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    assert not [tensor for tensor in float_model.graph.initializer if tensor.data_type in eight_bit]
    assert any(tensor.data_type == onnx.TensorProto.INT8 for tensor in int8_model.graph.initializer)
    assert any(node.op_type == "MatMulInteger" for node in int8_model.graph.node)

    def weight_bytes(model):
        return sum(onnx.numpy_helper.to_array(tensor).nbytes for tensor in model.graph.initializer)

    # A quarter and a little (scales, zero points, the position table left in float32); the files
    # of this tiny model are mostly graph, so their ratio is nearer 1 than a real model's (0.27).
    assert weight_bytes(int8_model) < 0.4 * weight_bytes(float_model)
    figures = exported[2]["int8"]
    assert figures["int8_onnx_bytes"] == manifest["files"]["model.int8.onnx"]["bytes"]
    assert figures["float_onnx_bytes"] == manifest["files"]["model.onnx"]["bytes"]
    assert figures["size_ratio"] == figures["int8_onnx_bytes"] / figures["float_onnx_bytes"] < 1


def test_the_int8_predictor_labels_real_reviews_as_the_float_model_does(exported, trained_imdb):
    bundle = _bundle(exported)
    reviews = trained_imdb.test_reviews + trained_imdb.validation[0]
    float_outputs = OnnxSentimentPredictor(bundle).predict(reviews)
    int8_predictor = OnnxSentimentPredictor(bundle, quantized=True)
    assert int8_predictor.model_path == bundle / "model.int8.onnx"
    int8_outputs = int8_predictor.predict(reviews)
    # An accuracy-level check against the float model as the oracle, not parity: the weights are rounded.
    assert np.mean(int8_outputs["label"] == float_outputs["label"]) >= 0.95
    assert 0 < np.max(np.abs(int8_outputs["probability"] - float_outputs["probability"])) < 0.1


def test_the_int8_check_reports_both_accuracies_on_the_callers_reviews(exported, trained_imdb):
    figures = exported[2]["int8"]
    reviews, labels = trained_imdb.validation
    assert figures["reviews"] == len(reviews) and figures["tolerance_points"] == 100.0
    float_labels = keras_probabilities(trained_imdb, reviews) >= 0.5
    int8_labels = OnnxSentimentPredictor(_bundle(exported), quantized=True).predict(reviews)["label"]
    assert figures["float_keras_accuracy"] == pytest.approx(np.mean(float_labels == np.asarray(labels)))
    assert figures["int8_onnx_accuracy"] == pytest.approx(np.mean(int8_labels == np.asarray(labels)))
    assert figures["points_lost"] == pytest.approx(
        100 * (figures["float_keras_accuracy"] - figures["int8_onnx_accuracy"])
    )


@pytest.mark.slow  # `make test` keeps the float model's refusal (test_disagreeing_export_is_refused_and_removed)
def test_an_int8_model_below_the_tolerance_is_refused_and_nothing_published(exported, trained_imdb, tmp_path):
    reviews = trained_imdb.validation[0]
    # The float model's own labels: it scores 100 %, so a tolerance of -1 point cannot be met.
    labels = (keras_probabilities(trained_imdb, reviews) >= 0.5).astype(int)
    export_dir = tmp_path / "export"
    pattern = r"model\.int8\.onnx: int8 ONNX accuracy .*% on \d+ labelled reviews .* float Keras model's 100\.00% \(tolerance -1 points\)"
    with pytest.raises(verified_export.ExportVerificationError, match=pattern):
        verified_export.export_and_verify(
            trained_imdb.model,
            trained_imdb.vectorizer,
            trained_imdb.vocabulary,
            TINY_CLASSIFIER.max_tokens,
            exported[1][:4],
            export_dir,
            accuracy_reviews=reviews,
            accuracy_labels=labels,
            int8_tolerance=-1,
        )
    assert not [path for path in export_dir.rglob("*") if path.is_file() or path.name.isdigit()]


def test_a_loss_exactly_at_the_tolerance_passes(exported, trained_imdb):
    # One batch of the check (64 reviews): the int8 model's activation scales are computed per batch,
    # so its labels depend on the batch a review is in; predicted here in the same one.
    reviews = trained_imdb.test_reviews[:64]
    labels = (keras_probabilities(trained_imdb, reviews) >= 0.5).astype(int)  # float Keras: 100 %
    int8_labels = OnnxSentimentPredictor(_bundle(exported), quantized=True).predict(reviews)["label"]
    lost = 100 * int(np.sum(int8_labels != labels)) / len(reviews)
    model = (trained_imdb.model, trained_imdb.vectorizer, TINY_CLASSIFIER.max_tokens, _bundle(exported))
    figures = verified_export.verify_int8_accuracy(*model, reviews, labels, tolerance=lost)
    assert figures["points_lost"] == lost and figures["float_keras_accuracy"] == 1.0
    with pytest.raises(verified_export.ExportVerificationError, match="model.int8.onnx"):
        verified_export.verify_int8_accuracy(*model, reviews, labels, tolerance=lost - 0.01)


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"int8_tolerance": float("nan")}, "int8_tolerance=nan"),
        ({"int8_tolerance": "0.3"}, "int8_tolerance='0.3'"),
        ({"int8_tolerance": True}, "int8_tolerance=True"),
        ({"accuracy_labels": [1, 0]}, "accuracy_labels=[1, 0]"),
        ({"accuracy_labels": [2, 0, 1]}, "accuracy_labels=[2, 0, 1]"),
        ({"accuracy_reviews": []}, "accuracy_reviews=[]"),
        ({"accuracy_reviews": ["good", b"bad", "ok"]}, "accuracy_reviews[1]=b'bad' (bytes)"),
    ],
)
def test_bad_int8_check_arguments_are_named_before_anything_is_written(trained_imdb, tmp_path, arguments, named):
    check = {"accuracy_reviews": ["good", "bad", "ok"], "accuracy_labels": [1, 0, 1], **arguments}
    if "accuracy_reviews" in arguments:
        check["accuracy_labels"] = [1] * len(arguments["accuracy_reviews"])
    with pytest.raises(ValueError, match=re.escape(named)):
        verified_export.export_and_verify(
            trained_imdb.model,
            trained_imdb.vectorizer,
            trained_imdb.vocabulary,
            TINY_CLASSIFIER.max_tokens,
            ["a review"],
            tmp_path / "export",
            **check,
        )
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("quantized", ["yes", 1, None])
def test_the_predictor_names_a_bad_quantized_flag(exported, quantized):
    with pytest.raises(TypeError, match=re.escape(f"quantized={quantized!r}")):
        OnnxSentimentPredictor(_bundle(exported), quantized=quantized)


def test_the_bundle_holds_the_fused_attention_model_with_the_float_models_probabilities(exported, trained_imdb):
    bundle = _bundle(exported)
    assert "model.fused.onnx" in json.loads((bundle / "manifest.json").read_text())["files"]
    assert fused_attention_count(onnx.load(str(bundle / "model.fused.onnx"))) == TINY_CLASSIFIER.num_layers
    predictor = OnnxSentimentPredictor(bundle, fused=True)
    assert predictor.model_path == bundle / "model.fused.onnx"
    reviews = trained_imdb.test_reviews + ODD_REVIEWS
    np.testing.assert_allclose(
        predictor.predict(reviews)["probability"], keras_probabilities(trained_imdb, reviews), atol=verified_export.ATOL
    )


def test_the_predictor_refuses_fused_int8_and_a_bad_fused_flag(exported):
    with pytest.raises(ValueError, match="Received: quantized=True, fused=True"):
        OnnxSentimentPredictor(_bundle(exported), quantized=True, fused=True)
    with pytest.raises(TypeError, match=re.escape("fused='yes'")):
        OnnxSentimentPredictor(_bundle(exported), fused="yes")


def test_a_bundle_without_the_int8_model_says_so(exported, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(_bundle(exported), bundle)
    (bundle / "model.int8.onnx").unlink()
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["files"]["model.int8.onnx"]  # a bundle published before int8 models
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    OnnxSentimentPredictor(bundle)
    with pytest.raises(FileNotFoundError, match=re.escape(str(bundle / "model.int8.onnx")) + ".*quantized=False"):
        OnnxSentimentPredictor(bundle, quantized=True)


def test_the_verify_command_names_a_changed_int8_model(exported, tmp_path, capsys):
    bundle = _published_copy(exported, tmp_path) / "onnx" / "imdb_sentiment" / "1"
    model = bundle / "model.int8.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    message = _verify_fails(bundle, capsys)
    assert str(model) in message and "truncated or altered" in message


@pytest.mark.parametrize(
    "bigram_ids", ["hashed", pytest.param("vocabulary", marks=pytest.mark.slow)]
)  # the default in CI
def test_the_ngram_attention_branch_exports_with_parity(bigram_ids, small_imdb_archive, imdb_cache_dir, tmp_path):
    """`attention_inputs="ngrams"` (weighted n-gram embeddings, attention pooling), with hashed bigrams
    or a learnt bigram vocabulary (its binary search), through the same export: SavedModel, ONNX and
    the int8 model, each held to the Keras model."""
    config = dataclasses.replace(TINY_CLASSIFIER, attention_inputs="ngrams", bigram_ids=bigram_ids)
    small = train_small(config, small_imdb_archive, imdb_cache_dir, tmp_path)
    reviews = verified_export.verification_reviews(small.test_reviews)
    result = verified_export.export_and_verify(
        small.model,
        small.vectorizer,
        small.vocabulary,
        config.max_tokens,
        reviews,
        tmp_path / "export",
        int8_tolerance=100.0,
        **accuracy_check(small),
    )
    parity = result["parity"]
    for key in ("savedmodel_fresh_process_max_abs_diff", "saved_model_cli_max_abs_diff", "onnx_max_abs_diff"):
        assert 0.0 <= parity[key] <= 1e-5
