import functools
import io
import os
import shutil
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from export import serving_layout
from export import verify
from export.translator import verified_export
from export.translator.savedmodel import SEARCHES
from models.decoding import translate_ids
from models.decoding_defaults import BEAM_SIZE
from models.decoding_defaults import LENGTH_PENALTY
from models.translation_text import detokenize
from pipelines import translate
from tests.serving_checks import warmup_requests
from tests.translation_fixtures import spanish_english_slice
from tests.translation_fixtures import tiny_translator

# Unknown words, accents, punctuation and an empty string besides ordinary test sentences.
EXTRA_SENTENCES = ["¿Quién es Zyxwv?", "¡ÉL NO ESTÁ AQUÍ!", ""]


def _sentences():
    return spanish_english_slice()[0][:16] + EXTRA_SENTENCES


@functools.cache
def _exported():
    """One verified export of the tiny translator, shared by the tests of this module."""
    model, vectorizers = tiny_translator()
    export_dir = tempfile.mkdtemp(prefix="translator-export-")
    path, report = verified_export.export_translator(model, vectorizers, export_dir, _sentences())
    return path, report


def _keras_translations(sentences, signature=serving_layout.SIGNATURE):
    """The Keras model's translations with the search the export serves under `signature`."""
    model, vectorizers = tiny_translator()
    beam_size, length_penalty = SEARCHES[signature]
    ids = translate_ids(
        model,
        vectorizers.source_ids(sentences),
        vectorizers.start_id,
        vectorizers.end_id,
        beam_size=beam_size,
        length_penalty=length_penalty,
    )
    return detokenize([vectorizers.target_tokens(row) for row in ids.numpy()])


def test_export_has_the_tf_serving_layout_and_passed_verification():
    path, report = _exported()
    assert os.path.basename(path) == "1" and os.path.basename(os.path.dirname(path)) == "translator"
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    for name in ("encoder.onnx", "decoder_step.onnx", "decoding.json", "target_vocabulary.txt"):
        assert os.path.isfile(os.path.join(path, "onnx", name)), name
    assert report == {"sentences": len(_sentences()), "saved_model_matches": True, "onnx_matches": True}
    assert sorted(os.listdir(os.path.dirname(path))) == ["1"]  # no staging directory left behind


@pytest.mark.slow
def test_export_lists_the_model_in_models_config_and_ships_warmup_requests():
    path, _ = _exported()
    version = Path(path)
    config = (version.parent.parent / "models.config").read_text()
    assert 'name: "translator"' in config and f'base_path: "{version.parent.resolve()}"' in config
    sentences = _sentences()
    expected = [("translator", "serving_default", batch) for batch in (sentences[:1], sentences[:8])]
    assert warmup_requests(version, "source") == expected


@pytest.mark.slow
def test_saved_model_in_a_fresh_process_translates_like_keras_with_beam_search_and_greedily():
    path, _ = _exported()
    sentences = spanish_english_slice()[0][100:132] + EXTRA_SENTENCES
    assert SEARCHES == {"serving_default": (BEAM_SIZE, LENGTH_PENALTY), "greedy": (1, 0.0)}
    translations = {}
    for signature in SEARCHES:
        translations[signature] = verified_export.reload_translations(path, sentences, signature)
        assert translations[signature] == _keras_translations(sentences, signature), signature
    assert translations["serving_default"] != translations["greedy"]  # two searches, not one twice


@pytest.mark.slow
def test_onnx_greedy_decoder_matches_the_tf_decoder_for_any_batch_and_length():
    path, _ = _exported()
    model, vectorizers = tiny_translator()
    for begin, batch, width in ((200, 1, 16), (210, 5, 9), (220, 7, 12)):
        source_ids = vectorizers.source_ids(spanish_english_slice()[0][begin : begin + batch]).numpy()[:, :width]
        expected = translate_ids(model, source_ids, vectorizers.start_id, vectorizers.end_id).numpy()
        np.testing.assert_array_equal(
            verified_export.OnnxGreedyDecoder(os.path.join(path, "onnx"))(source_ids), expected
        )


@pytest.mark.slow
@pytest.mark.parametrize("flags, signature", [([], "serving_default"), (["--beam-size", "1"], "greedy")])
def test_translate_command_reads_the_export(flags, signature):
    path, _ = _exported()
    sentences = ["Tengo hambre.", "¿Dónde está Tom?"]
    printed = io.StringIO()
    with redirect_stdout(printed):
        translate.main(["--export", os.path.dirname(path), *flags, *sentences])
    assert printed.getvalue().splitlines() == _keras_translations(sentences, signature)


@pytest.mark.slow
def test_translate_command_prints_one_line_per_stdin_line_from_the_export(monkeypatch):
    path, _ = _exported()
    sentences = ["Tengo hambre.", "¿Dónde está la estación de tren?"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(f"{sentences[0]}\n\n{sentences[1]}\n".encode())))
    printed = io.StringIO()
    with redirect_stdout(printed):
        translate.main(["--export", os.path.dirname(path), "--beam-size", "1"])
    expected = _keras_translations(sentences, "greedy")
    assert all(expected)  # the untrained model's greedy search says something: a blank line is no translation
    assert printed.getvalue().split("\n") == [expected[0], "", expected[1], ""]


@pytest.mark.slow
def test_translate_command_refuses_non_utf8_stdin_naming_the_line(monkeypatch, capsys):
    path, _ = _exported()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Hola.\n\nGr\xfc\xdfe\n")))
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--export", os.path.dirname(path)])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "stdin line 3 is not UTF-8" in captured.err and "0xfc" in captured.err


@pytest.mark.slow
def test_verification_fails_loudly_when_the_model_disagrees():
    path, _ = _exported()
    model, vectorizers = tiny_translator()
    bias = model.output_projection.bias
    original = bias.numpy()
    changed = original.copy()
    changed[vectorizers.end_id] += 50.0  # now every translation ends at once
    bias.assign(changed)
    try:
        with pytest.raises(verified_export.ExportVerificationError, match="SavedModel"):
            verified_export.verify_export(model, vectorizers, path, _sentences()[:4])
    finally:
        bias.assign(original)


@pytest.mark.slow
def test_a_failed_export_publishes_nothing(tmp_path, monkeypatch):
    model, vectorizers = tiny_translator()

    def wrong_onnx(source_ids):
        return np.zeros((len(source_ids), vectorizers.sequence_length), np.int32)

    monkeypatch.setattr(verified_export, "write_onnx", lambda *args: None)
    monkeypatch.setattr(verified_export, "OnnxGreedyDecoder", lambda directory: wrong_onnx)
    monkeypatch.setattr(
        verified_export,
        "reload_translations",
        lambda path, sentences, signature: _keras_translations(sentences, signature),
    )
    monkeypatch.setattr(verified_export, "write_saved_model", lambda *args: None)
    with pytest.raises(verified_export.ExportVerificationError, match="ONNX"):
        verified_export.export_translator(model, vectorizers, str(tmp_path), _sentences()[:4])
    assert os.listdir(tmp_path / "translator") == []


@pytest.mark.slow
def test_versions_count_up(tmp_path):
    """The translator publishes through export.serving_layout: the next free number, never a reuse."""
    assert serving_layout.existing_versions(tmp_path / "absent") == []
    for name in ("1", "7", "notes", ".3-staging"):
        (tmp_path / name).mkdir()
    staging = tmp_path / ".staging-translator"
    staging.mkdir()
    assert serving_layout.publish(staging, tmp_path) == tmp_path / "8"


@pytest.mark.slow
def test_the_verify_command_proves_the_translator_export_and_names_a_changed_file(tmp_path, capsys):
    path, _ = _exported()
    verify.main([path])
    assert capsys.readouterr().out.startswith(f"ok {path}: translator (savedmodel+onnx)")
    copy = tmp_path / "1"
    shutil.copytree(path, copy)
    decoder = copy / "onnx" / "decoder_step.onnx"
    decoder.write_bytes(decoder.read_bytes()[:-10])
    with pytest.raises(SystemExit):
        verify.main([str(copy)])
    assert str(decoder) in capsys.readouterr().err
