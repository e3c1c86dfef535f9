"""The main job in --smoke size on a small archive cut from the real one: train, evaluate, export,
verify; plus resuming after an interruption, mixed precision, XLA and a mirrored strategy."""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from pipelines import imdb_data
from pipelines import main_job
from pipelines import resumable_training
from pipelines import train_imdb
from tests.imdb_fixtures import Interrupt
from tests.imdb_fixtures import interrupted_after_first_epoch
from tests.imdb_fixtures import smoke_args
from tests.test_train_imdb_families import assert_family_run

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_main_job_end_to_end(small_imdb_archive, imdb_cache_dir, tmp_path, capsys):
    """The app's one end-to-end run, over a minute: three seeds' trainings, the export, its
    verification in fresh processes and the report, each checked here once."""
    export_dir = tmp_path / "export"
    summary = main_job.main(
        smoke_args(
            small_imdb_archive, imdb_cache_dir, tmp_path / "run", "--epochs", "1", "--export-dir", str(export_dir)
        )
    )
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.rindex("\n{\n") + 1 :]) == summary
    training = json.loads((tmp_path / "run" / "summary.json").read_text())
    # No pretraining checkpoint beside the run: random initial weights, and one line (not one per
    # seed) saying how to make one.
    assert training["pretrained"] is None
    assert printed.count(f"No pretrained encoder at {tmp_path / 'imdb_pretrain'}: ") == 1
    assert f"`python -m pipelines.pretrain_imdb --output-dir {tmp_path / 'imdb_pretrain'}` (same --data" in printed
    assert training["data"]["train"] == 300 - train_imdb.SMOKE_DATA["validation_size"]
    assert training["data"]["validation"] == train_imdb.SMOKE_DATA["validation_size"]
    assert training["data"]["test"] == train_imdb.SMOKE_DATA["max_test"]
    assert training["epochs_run"] == 1 and training["training_seconds"] > 0
    assert training["train_examples_per_second"] > 0 and training["parameters"] > 0
    assert summary["test_accuracy"] == training["test_accuracy"]
    assert summary == json.loads((tmp_path / "run" / "main_job.json").read_text())
    # Three seeds by default: the exported run's and two more, each branch's spread over them.
    seed_runs = [training] + [
        json.loads((tmp_path / "run" / "seeds" / str(seed) / "summary.json").read_text()) for seed in (1338, 1339)
    ]
    seeds = summary["seeds"]
    assert seeds == training["seeds"] and seeds["seeds"] == [run["seed"] for run in seed_runs] == [1337, 1338, 1339]
    for name, key in (("ensemble", None), ("attention", "attention"), ("ngram", "ngram")):
        values = [run["test_accuracy"] if key is None else run["test_accuracy_by_branch"][key] for run in seed_runs]
        assert seeds[name]["values"] == values
        assert seeds[name]["mean"] == pytest.approx(np.mean(values)) and seeds[name]["std"] == pytest.approx(
            np.std(values, ddof=1)
        )
    exports = summary["exports"]
    assert exports["savedmodel"] == str(export_dir / "imdb_sentiment" / "1")
    assert (Path(exports["onnx"]) / "model.onnx").is_file()
    for key in ("savedmodel_fresh_process_max_abs_diff", "saved_model_cli_max_abs_diff", "onnx_max_abs_diff"):
        assert exports["parity"][key] <= 1e-5
    # The int8 model was checked on the validation slice (never the test split), beside the float model.
    int8 = exports["int8"]
    tolerance = main_job.SMOKE_INT8_TOLERANCE_POINTS  # --smoke reports the check, the full run enforces it
    assert int8["reviews"] == train_imdb.SMOKE_DATA["validation_size"] and int8["tolerance_points"] == tolerance
    assert int8["points_lost"] <= tolerance and 0 < int8["int8_onnx_bytes"] < int8["float_onnx_bytes"]
    assert training["validation_accuracy"] == pytest.approx(int8["float_keras_accuracy"], abs=1e-6)
    assert (Path(exports["onnx"]) / "model.int8.onnx").is_file()
    # The reported accuracy is the exported model's on the test reviews, recomputed here.
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir, allow_download=False)
    test = imdb_data.split_reviews(cache, **train_imdb.SMOKE_DATA).test
    texts, labels = map(np.asarray, zip(*test.as_numpy_iterator()))
    serve = tf.saved_model.load(exports["savedmodel"]).signatures["serving_default"]
    predicted = serve(reviews=tf.constant(texts))["label"].numpy()
    assert training["test_accuracy"] == pytest.approx(np.mean(predicted == labels), abs=1e-6)
    assert (tmp_path / "run" / "vocabulary.txt").is_file()
    assert list((tmp_path / "run" / "tensorboard").rglob("events.out.tfevents.*"))
    # The report sits beside main_job.json (tests/test_imdb_report.py checks its content).
    report = (tmp_path / "run" / "report.html").read_text()
    assert summary["report"] == str(tmp_path / "run" / "report.html") and summary["report_seconds"] > 0
    assert f"{summary['test_accuracy']:.4f}" in report and report.count("data:image/png;base64,") == 2
    assert summary["seed"] == training["seed"] and f"this run (seed {training['seed']})" in report  # the ablation
    assert f"Confusion matrix ({train_imdb.SMOKE_DATA['max_test']:,} test reviews)" in report
    assert "Test accuracy over 3 seeds (1337, 1338, 1339)" in report
    assert f"{100 * seeds['attention']['mean']:.2f} % ± {100 * seeds['attention']['std']:.2f}" in report
    # The default family's run of the checks every family's run passes (tests/test_train_imdb_families.py).
    assert_family_run(train_imdb.SentimentClassifierConfig.attention, summary, tmp_path / "run", tmp_path)


def backed_up_optimizer_steps(output_dir):
    """The optimizer's iteration count in the last committed backup."""
    backup = output_dir / resumable_training.BACKUP_DIR / resumable_training.read_training_state(output_dir)["weights"]
    with h5py.File(backup, "r") as weights:
        return int(weights["optimizer/vars/0"][()])


@pytest.mark.slow
def test_rerunning_an_interrupted_run_resumes_it(small_imdb_archive, imdb_cache_dir, tmp_path, capsys):
    args = smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path, "--epochs", "2")
    with interrupted_after_first_epoch(), pytest.raises(Interrupt):
        train_imdb.main(args)
    assert [row["epoch"] for row in resumable_training.read_history(tmp_path)] == [0]
    steps_after_first_epoch = backed_up_optimizer_steps(tmp_path)
    capsys.readouterr()

    run = train_imdb.main(args)  # the same command again
    assert [row["epoch"] for row in resumable_training.read_history(tmp_path)] == [0, 1]
    assert run.summary["epochs_this_invocation"] == 1 and run.summary["epochs_run"] == 2
    assert run.summary["resumed_from_epoch"] == 1
    assert f"Resuming {tmp_path}: 1 epochs done" in capsys.readouterr().out
    # The optimizer state came back too: its step count goes on from the first epoch's.
    assert backed_up_optimizer_steps(tmp_path) > 1.5 * steps_after_first_epoch


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_with_xla(small_imdb_archive, imdb_cache_dir, tmp_path, policy):
    run = train_imdb.main(
        smoke_args(
            small_imdb_archive, imdb_cache_dir, tmp_path, "--epochs", "1", "--mixed-precision", policy, "--jit-compile"
        )
    )
    assert run.summary["precision"] == policy and run.summary["jit_compile"] is True
    assert run.model.get_layer("token_and_position_embedding").dtype_policy.name == policy
    assert run.model.get_layer("probability").compute_dtype == "float32"
    losses = [row["loss"] for row in resumable_training.read_history(tmp_path)]
    assert np.all(np.isfinite(losses)) and np.isfinite(run.summary["test_loss"])


@pytest.mark.slow
def test_mirrored_strategy_over_two_logical_cpus(small_imdb_archive, imdb_cache_dir, tmp_path):
    # Logical devices must be configured before TensorFlow initialises: the CLI in a fresh process.
    args = smoke_args(
        small_imdb_archive, imdb_cache_dir, tmp_path, "--epochs", "1", "--strategy", "mirrored", "--cpu-devices", "2"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "pipelines.train_imdb", *args]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["strategy"] == "mirrored" and summary["replicas"] == 2
    # An accuracy over the whole test slice: a whole number of correct reviews, not a mean of batch means.
    correct = summary["test_accuracy"] * summary["data"]["test"]
    assert correct == pytest.approx(round(correct), abs=1e-6)


@pytest.fixture
def op_determinism_turned_off_after():
    """Turns op determinism off again after the test: TensorFlow offers no public way, and it would
    hold for every later test of the process."""
    from tensorflow.python.framework import config

    yield config
    config.disable_op_determinism()


@pytest.mark.slow
def test_two_seeded_runs_in_one_process_give_identical_weights_and_figures(
    small_imdb_archive, imdb_cache_dir, tmp_path, op_determinism_turned_off_after, capsys
):
    """Two `--op-determinism` runs agree bit for bit; their output shows each epoch's steps and no
    framework warning (the data pipeline's length is known, no `shuffle=True` misuse)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [
            train_imdb.main(
                smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path / name, "--epochs", "1", "--op-determinism")
            )
            for name in ("first", "second")
        ]
    # The first epoch shows its steps, with no framework warning.
    printed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # without the terminal colours
    assert "/Unknown" not in printed  # Keras's progress bar before it knows the steps
    assert re.search(r"\b(\d+)/\1 ", printed), printed[-2000:]  # "N/N" at the end of epoch 1
    framework = [
        str(w.message) for w in caught if "shuffle=True" in str(w.message) or "ran out of data" in str(w.message)
    ]
    assert framework == []
    assert op_determinism_turned_off_after.is_op_determinism_enabled()
    first, second = runs
    for weights, again in zip(first.model.get_weights(), second.model.get_weights(), strict=True):
        np.testing.assert_array_equal(weights, again)
    figures = ("test_accuracy", "test_loss", "test_accuracy_by_branch", "validation_accuracy", "ensemble_weights")
    assert {name: first.summary[name] for name in figures} == {name: second.summary[name] for name in figures}
    assert [row["loss"] for row in resumable_training.read_history(tmp_path / "first")] == [
        row["loss"] for row in resumable_training.read_history(tmp_path / "second")
    ]
    assert first.summary["op_determinism"] is True and first.summary["cpu_cores"] == len(os.sched_getaffinity(0))


def test_smoke_never_overrides_an_explicit_data_flag():
    smoke = train_imdb.parse_args(["--smoke", "--validation-size", "10", "--max-train", "50"])
    assert train_imdb.data_limits(smoke) == {**train_imdb.SMOKE_DATA, "validation_size": 10, "max_train": 50}
    assert train_imdb.data_limits(train_imdb.parse_args(["--smoke"])) == train_imdb.SMOKE_DATA
    assert train_imdb.data_limits(train_imdb.parse_args([])) == {"validation_size": train_imdb.VALIDATION_SIZE}
