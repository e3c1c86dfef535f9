"""`python -m pipelines.translate --run`: one output line per input line, UTF-8 input, and a run
whose vocabularies do not match its model refused."""

import io
import os
import shutil
from contextlib import redirect_stdout

import pytest

from models.translation_text import VOCABULARY_FILES
from pipelines import translate
from tests.translation_fixtures import tiny_translator
from tests.translation_fixtures import write_tiny_run

SENTENCES = ["Tengo hambre.", "¿Dónde está la estación de tren?"]
GREEDY = ["--beam-size", "1"]  # the untrained tiny model's beam search ends at once: greedy says something


def _one_by_one(run_dir):
    """The translation of each of `SENTENCES` alone."""
    translations = [translate.translate_with_run(str(run_dir), [sentence], beam_size=1)[0] for sentence in SENTENCES]
    assert all(translations)  # so a blank output line is never mistaken for a translation
    return translations


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_tiny_run(tmp_path_factory.mktemp("translator_run"))


def _stdin(monkeypatch, data):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def _printed(argv):
    printed = io.StringIO()
    with redirect_stdout(printed):
        translate.main(argv)
    return printed.getvalue()


def _refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        translate.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing translated, so no line is lost or shifted
    return captured.err.strip()


def test_every_stdin_line_gets_one_output_line_blank_lines_blank(run_dir, monkeypatch):
    one_by_one = _one_by_one(run_dir)
    _stdin(monkeypatch, f"{SENTENCES[0]}\n\n   \n{SENTENCES[1]}\r\n\n".encode())

    printed = _printed(["--run", str(run_dir), *GREEDY])

    assert printed == f"{one_by_one[0]}\n\n\n{one_by_one[1]}\n\n"


def test_an_empty_argument_prints_an_empty_line_in_its_place(run_dir):
    one_by_one = _one_by_one(run_dir)
    assert _printed(["--run", str(run_dir), *GREEDY, SENTENCES[0], "", SENTENCES[1]]).split("\n") == [
        one_by_one[0],
        "",
        one_by_one[1],
        "",
    ]


def test_only_blank_lines_print_as_many_empty_lines_without_a_model(monkeypatch):
    _stdin(monkeypatch, b"\n \n")
    assert _printed(["--run", "no-such-run"]) == "\n\n"


def test_non_utf8_stdin_is_refused_naming_the_line(run_dir, monkeypatch, capsys):
    _stdin(monkeypatch, b"Tengo hambre.\n" + b"caf\xe9 con leche\n" + "¿Dónde?\n".encode())
    error = _refused(["--run", str(run_dir)], capsys)
    assert error.count("\n") == 0
    assert "stdin line 2 is not UTF-8" in error and "0xe9" in error and "must be UTF-8" in error


def test_a_non_utf8_argument_is_refused_naming_its_position(run_dir, capsys):
    argument = os.fsdecode(b"caf\xe9")  # what Python makes of a Latin-1 byte in argv
    error = _refused(["--run", str(run_dir), "Hola.", argument], capsys)
    assert "argument 2 is not UTF-8" in error and "0xe9" in error


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_cut_vocabulary_is_refused_naming_the_file_and_both_sizes(run_dir, tmp_path, side, capsys):
    cut = shutil.copytree(run_dir, tmp_path / "run")
    vocabulary = cut / VOCABULARY_FILES[side]
    tokens = vocabulary.read_text(encoding="utf-8").splitlines()
    vocabulary.write_text("".join(f"{token}\n" for token in tokens[: len(tokens) // 2]), encoding="utf-8")
    model, _ = tiny_translator()
    expected = {"source": model.source_vocabulary_size, "target": model.target_vocabulary_size}[side]
    assert expected == len(tokens) + 2  # padding and OOV are not in the file

    error = _refused(["--run", str(cut), "Hola."], capsys)
    assert error.count("\n") == 0 and str(vocabulary) in error
    assert f"gives {len(tokens) // 2 + 2} token ids, the model takes {expected}" in error
