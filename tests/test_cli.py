"""Every CLI's bad input ends before any work with one `<prog>: error: ...` line naming the flag
(or the file) and the value received, exit status 2, no traceback; `--debug` shows the error."""

import importlib
from pathlib import Path

import pytest

from appkit import cli
from export.translator import verified_export
from pipelines import explain_imdb
from pipelines import imdb_data
from pipelines import launch
from pipelines import main_job
from pipelines import pretrain_imdb
from pipelines import train_imdb
from pipelines import train_translator
from pipelines import translate

CLIS = {
    "train_imdb": train_imdb.main,
    "main_job": main_job.main,
    "pretrain_imdb": pretrain_imdb.main,
    "train_translator": train_translator.main,
    "translate": translate.main,
    "export.translator": verified_export.main,
    "explain_imdb": explain_imdb.main,
    "launch": launch.main,
}

# (cli, argv, text the one error line must hold: the flag and the value received)
BAD_FLAGS = [
    ("train_imdb", ["--batch-size", "0"], "--batch-size: must be a positive integer, got '0'"),
    ("train_imdb", ["--batch-size", "-3"], "--batch-size: must be a positive integer, got '-3'"),
    ("train_imdb", ["--batch-size", "2.5"], "--batch-size: expected an integer, got '2.5'"),
    ("train_imdb", ["--epochs", "0"], "--epochs: must be a positive integer, got '0'"),
    ("train_imdb", ["--max-train", "-10"], "--max-train: must be a positive integer, got '-10'"),
    ("train_imdb", ["--max-test", "0"], "--max-test: must be a positive integer, got '0'"),
    ("train_imdb", ["--validation-size", "0"], "--validation-size: must be a positive integer, got '0'"),
    ("train_imdb", ["--learning-rate", "-1"], "--learning-rate: must be a positive finite number, got '-1'"),
    ("train_imdb", ["--learning-rate", "0"], "--learning-rate: must be a positive finite number, got '0'"),
    ("train_imdb", ["--learning-rate", "nan"], "--learning-rate: must be a positive finite number, got 'nan'"),
    ("train_imdb", ["--learning-rate", "inf"], "--learning-rate: must be a positive finite number, got 'inf'"),
    ("train_imdb", ["--learning-rate", "fast"], "--learning-rate: expected a number, got 'fast'"),
    ("train_imdb", ["--weight-decay", "-0.1"], "--weight-decay: must be a non-negative finite number, got '-0.1'"),
    ("train_imdb", ["--warmup-fraction", "1.5"], "--warmup-fraction: must be a number in [0, 1), got '1.5'"),
    ("train_imdb", ["--patience", "-1"], "--patience: must be a non-negative integer, got '-1'"),
    ("train_imdb", ["--cpu-devices", "0"], "--cpu-devices: must be a positive integer, got '0'"),
    ("train_imdb", ["--seed", "-5"], "--seed: must be a non-negative integer, got '-5'"),
    ("train_imdb", ["--num-heads", "0"], "--num-heads: must be a positive integer, got '0'"),
    ("train_imdb", ["--embedding-dim", "-8"], "--embedding-dim: must be a positive integer, got '-8'"),
    # The vocabulary sizes' ranges are checked at parse time, not by Keras's `max_tokens` deep in training.
    ("train_imdb", ["--vocabulary-size", "1"], "--vocabulary-size: must be an integer >= 3, got '1'"),
    ("train_imdb", ["--vocabulary-size", "2"], "--vocabulary-size: must be an integer >= 3, got '2'"),
    ("main_job", ["--vocabulary-size", "1"], "--vocabulary-size: must be an integer >= 3, got '1'"),
    ("pretrain_imdb", ["--vocabulary-size", "0"], "--vocabulary-size: must be an integer >= 3, got '0'"),
    ("train_imdb", ["--attention-bigram-buckets", "-1"], "--attention-bigram-buckets: must be an integer >= 0"),
    ("train_imdb", ["--num-heads", "3"], "embedding_dim=64, num_heads=3"),
    ("train_imdb", ["--dropout", "1"], "--dropout: must be a number in [0, 1), got '1'"),
    ("train_imdb", ["--dropout", "-0.2"], "--dropout: must be a number in [0, 1), got '-0.2'"),
    ("train_imdb", ["--ngram-scale", "0"], "--ngram-scale: must be a positive finite number, got '0'"),
    ("train_imdb", ["--pooling", "mean,sum"], "pooling=('mean', 'sum')"),
    ("train_imdb", ["--sequence-length", "4096"], "sequence_length=4096, max_tokens=2048"),
    ("train_imdb", ["--mixed-precision", "float64"], "--mixed-precision: invalid choice: 'float64'"),
    ("train_imdb", ["--checkpoint-every", "0"], "--checkpoint-every: must be a positive integer, got '0'"),
    ("train_imdb", ["--collective-timeout", "-5"], "--collective-timeout: must be a positive integer, got '-5'"),
    ("main_job", ["--batch-size", "0"], "--batch-size: must be a positive integer, got '0'"),
    ("pretrain_imdb", ["--epochs", "0"], "--epochs: must be a positive integer, got '0'"),
    ("pretrain_imdb", ["--max-train", "-1"], "--max-train: must be a positive integer, got '-1'"),
    ("pretrain_imdb", ["--embedding-dim", "0"], "--embedding-dim: must be a positive integer, got '0'"),
    ("pretrain_imdb", ["--strategy", "multi_worker"], "--strategy=multi_worker"),
    ("main_job", ["--learning-rate", "-1"], "--learning-rate: must be a positive finite number, got '-1'"),
    ("train_translator", ["--tokens-per-batch", "0"], "--tokens-per-batch: must be a positive integer, got '0'"),
    ("train_translator", ["--epochs", "-2"], "--epochs: must be a positive integer, got '-2'"),
    ("train_translator", ["--learning-rate", "-1"], "--learning-rate: must be a positive finite number, got '-1'"),
    ("train_translator", ["--beam-size", "0"], "--beam-size: must be a positive integer, got '0'"),
    ("train_translator", ["--max-pairs", "-10"], "--max-pairs: must be a positive integer, got '-10'"),
    ("train_translator", ["--test-fraction", "1"], "--test-fraction: must be a number in [0, 1), got '1'"),
    ("train_translator", ["--dropout", "2"], "--dropout: must be a number in [0, 1), got '2'"),
    ("train_translator", ["--num-heads", "0"], "--num-heads: must be a positive integer, got '0'"),
    ("train_translator", ["--source-vocabulary-size", "1"], "--source-vocabulary-size: must be an integer >= 3"),
    ("train_translator", ["--target-vocabulary-size", "4"], "--target-vocabulary-size: must be an integer >= 5"),
    ("train_translator", ["--tie-embeddings", "maybe"], "--tie-embeddings: expected true or false, got 'maybe'"),
    ("translate", ["--run", "x", "--beam-size", "0", "hola"], "--beam-size: must be a positive integer, got '0'"),
    ("export.translator", ["--verify-sentences", "0"], "--verify-sentences: must be a positive integer, got '0'"),
    ("export.translator", ["--verify-sentences", "x"], "--verify-sentences: expected an integer, got 'x'"),
    ("main_job", ["--model-name", "../escape"], "--model-name: `model_name` must be a directory name"),
    ("main_job", ["--model-name", "a/b"], "model_name='a/b'"),
    ("main_job", ["--model-name", ""], "model_name=''"),
    ("main_job", ["--model-name", ".hidden"], "model_name='.hidden'"),
    ("train_translator", ["--warmup-fraction", "nan"], "--warmup-fraction: must be a number in [0, 1), got 'nan'"),
    ("train_translator", ["--validation-fraction", "-0.1"], "--validation-fraction: must be a number in [0, 1)"),
    ("train_translator", ["--patience", "-1"], "--patience: must be a non-negative integer, got '-1'"),
    ("translate", ["--run", "x", "--attention", "a.pdf", "hola"], "--attention must end in .html or .png, got 'a.pdf'"),
    ("translate", ["--export", "x", "--attention", "a.html", "hola"], "--attention needs --run"),
    ("translate", ["--export", "x", "--beam-size", "3", "hola"], "--beam-size with --export must be 1 or 4, got 3"),
    ("train_translator", ["--label-smoothing", "1"], "--label-smoothing: must be a number in [0, 1), got '1'"),
    ("train_translator", ["--split-by", "sentence"], "--split-by: invalid choice: 'sentence'"),
    (
        "train_translator",
        ["--length-penalty", "-1"],
        "--length-penalty: must be a non-negative finite number, got '-1'",
    ),
    ("explain_imdb", ["--top", "0", "good"], "--top: must be a positive integer, got '0'"),
    ("explain_imdb", ["--top", "x", "good"], "--top: expected an integer, got 'x'"),
    ("explain_imdb", ["--output", "x.pdf", "good"], "--output must end in .html or .png, got 'x.pdf'"),
    ("launch", ["--workers", "0", "--", "true"], "--workers: must be a positive integer, got '0'"),
    (
        "launch",
        ["--grace-seconds", "-5", "--", "true"],
        "--grace-seconds: must be a non-negative finite number, got '-5'",
    ),
    ("launch", ["--grace-seconds", "nan", "--", "true"], "got 'nan'"),
    ("launch", ["--workers", "2"], "no command: give it after `--`"),
    ("launch", ["--workers", "2", "--"], "`command` is empty"),
]


def _error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]


@pytest.mark.parametrize("name, argv, expected", BAD_FLAGS, ids=[" ".join([c, *a]) for c, a, _ in BAD_FLAGS])
def test_bad_flag_exits_2_naming_flag_and_value(name, argv, expected, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing may be written; the default output dirs would land here
    with pytest.raises(SystemExit) as exit_info:
        CLIS[name](argv)
    assert exit_info.value.code == 2
    line = _error_line(capsys)
    assert line.startswith(f"python -m {name if '.' in name else f'pipelines.{name}'}: error:")
    assert expected in line
    assert list(tmp_path.iterdir()) == []  # checked before any work


def _bad_inputs(tmp_path):
    """(cli, argv, text of the one error line) for inputs found missing, corrupt or unwritable."""
    corrupt = tmp_path / "corrupt.tar.gz"
    corrupt.write_bytes(b"not a tar archive")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    output = ["--output-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")]
    return [
        (
            "train_imdb",
            ["--smoke", "--no-download", "--data", str(tmp_path / "absent.tar.gz"), *output],
            "absent.tar.gz",
        ),
        ("train_imdb", ["--smoke", "--no-download", "--data", str(corrupt), *output], "corrupt.tar.gz is corrupt"),
        ("train_imdb", ["--smoke", "--output-dir", str(a_file / "run")], f"--output-dir '{a_file / 'run'}' is not a"),
        (
            "train_imdb",
            ["--smoke", "--no-download", "--pretrained", str(tmp_path / "no_checkpoint"), *output],
            f"--pretrained={str(tmp_path / 'no_checkpoint')!r}",
        ),
        ("pretrain_imdb", ["--smoke", "--no-download", "--data", str(corrupt), *output], "corrupt.tar.gz is corrupt"),
        ("pretrain_imdb", ["--smoke", "--output-dir", str(a_file / "p")], f"--output-dir '{a_file / 'p'}' is not a"),
        (
            "main_job",
            ["--smoke", "--export-dir", str(a_file / "export"), *output],
            f"--export-dir '{a_file / 'export'}' is not a writable directory",
        ),
        (
            "train_translator",
            ["--smoke", "--data", str(tmp_path / "absent.txt"), "--output-dir", str(tmp_path / "t")],
            f"path={str(tmp_path / 'absent.txt')!r}",
        ),
        ("train_translator", ["--smoke", "--output-dir", str(a_file / "t")], f"--output-dir '{a_file / 't'}' is not a"),
        ("translate", ["--export", str(tmp_path / "no_export"), "hola"], "holds no SavedModel version"),
        ("export.translator", ["--run", str(tmp_path / "no_run"), "--export-dir", str(tmp_path / "e")], "no_run"),
        (
            "export.translator",
            ["--run", str(tmp_path), "--export-dir", str(a_file / "e")],
            f"--export-dir '{a_file / 'e'}' is not a writable directory",
        ),
        ("explain_imdb", ["--run", str(tmp_path / "no_run"), "good"], "holds no summary.json"),
        (
            "explain_imdb",
            ["--run", str(tmp_path / "no_run"), "--output", str(a_file / "x.html"), "good"],
            f"--output's directory '{a_file}' is not a writable directory",
        ),
        ("translate", ["--run", str(tmp_path / "no_run"), "hola"], "no_run"),
        ("launch", ["--workers", "1", "--", str(tmp_path / "no_such_program")], "no_such_program"),
    ]


def test_missing_corrupt_or_unwritable_paths_end_in_one_line(capsys, tmp_path):
    for name, argv, expected in _bad_inputs(tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            CLIS[name](argv)
        assert exit_info.value.code == 2, (name, argv)
        line = _error_line(capsys)
        assert "error:" in line and expected in line, (name, line)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("*.weights.h5"))


def test_debug_shows_the_error_itself(tmp_path):
    argv = ["--smoke", "--no-download", "--data", str(tmp_path / "absent.tar.gz"), "--output-dir", str(tmp_path / "r")]
    with pytest.raises(imdb_data.ImdbDataError, match="absent.tar.gz"):
        train_imdb.main([*argv, "--cache-dir", str(tmp_path / "c"), "--debug"])


@pytest.mark.parametrize(
    "parse, good, bad",
    [
        (cli.positive_int, {"1": 1, "32": 32}, ["0", "-1", "1.0", "", "x"]),
        (cli.non_negative_int, {"0": 0, "7": 7}, ["-1", "0.5"]),
        (cli.positive_float, {"1e-3": 1e-3, "2": 2.0}, ["0", "-1", "nan", "inf", "-inf", "x"]),
        (cli.non_negative_float, {"0": 0.0, "0.05": 0.05}, ["-0.01", "nan", "inf"]),
        (cli.fraction, {"0": 0.0, "0.5": 0.5, "0.999": 0.999}, ["1", "-0.1", "nan", "2"]),
        (cli.int_at_least(3), {"3": 3, "20000": 20000}, ["2", "0", "-1", "3.5", "x"]),
        (cli.parse_bool, {"true": True, "False": False}, ["yes", "1", ""]),
        (cli.comma_separated, {"mean": ("mean",), "mean,max": ("mean", "max")}, []),
    ],
)
def test_flag_types(parse, good, bad):
    import argparse

    for text, value in good.items():
        assert parse(text) == value and type(parse(text)) is type(value)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            parse(text)


def test_config_size_flags_take_their_smallest_values():
    args = train_imdb.parse_args(["--vocabulary-size", "3", "--attention-bigram-buckets", "0", "--pretrained", "none"])
    config = train_imdb.model_config(args)
    assert (config.vocabulary_size, config.attention_bigram_buckets) == (3, 0)
    config = train_translator.model_config(
        train_translator.parse_args(["--source-vocabulary-size", "3", "--target-vocabulary-size", "5"])
    )
    assert (config.source_vocabulary_size, config.target_vocabulary_size) == (3, 5)


def _commands():
    """`{command: module}` for every `python -m` entry point of the apps: the modules of pipelines/
    and export/ that run as a script (a package's `__main__` is the package's command)."""
    root = Path(__file__).resolve().parents[1]
    commands = {}
    for package in ("pipelines", "export"):
        for path in (root / package).rglob("*.py"):
            if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"):
                module = ".".join(path.relative_to(root).with_suffix("").parts)
                commands[module.removesuffix(".__main__")] = module
    return commands


def test_the_apps_have_command_line_entry_points():
    assert {"export.verify", "export.translator", "pipelines.main_job", "pipelines.train_imdb"} <= set(_commands())


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_cli_prints_its_usage_on_help(command, capsys):
    module = importlib.import_module(_commands()[command])
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {command} ")
    assert "--debug" in out  # and the options below it
