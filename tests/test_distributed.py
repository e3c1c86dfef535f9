"""Multi-worker training on two loopback workers (`pipelines.distributed`, `pipelines.launch`).

The oracle for the distributed step is Keras's own `fit` in one process: two workers with a
global batch of 2b (b each) must end with the weights of one `fit` with batch 2b over the same
batches, and with identical weights on both workers. For the translator the global batches are
token-budgeted (sizes vary, some odd, one of a single sentence: worker 1's share is empty) and
Keras's loss is the mean over the real target tokens of the whole global batch: the workers must
divide by the global token count, not average their own means.
"""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from pipelines import imdb_data
from pipelines import launch
from pipelines import train_imdb
from tests import distributed_worker
from tests.benchmark_smoke import assert_smoke_run
from tests.reference import log_softmax as reference_log_softmax

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = [sys.executable, "-m", "tests.distributed_worker"]


def initial_weights(path, build=distributed_worker.build_model):
    keras.utils.set_random_seed(0)
    weights = build().get_weights()
    np.savez(path, *weights)
    return weights


def worker_args(tmp_path, *extra):
    return [
        "--output-dir",
        str(tmp_path / "run"),
        "--initial",
        str(tmp_path / "initial.npz"),
        "--weights-out",
        str(tmp_path),
        *extra,
    ]


def run_two_workers(tmp_path, *extra):
    """Both workers' `(weights, optimizer step)` after a two-worker run of `tests.distributed_worker`."""
    log = io.StringIO()
    status = launch.launch([*WORKER, *worker_args(tmp_path, *extra)], 2, output=log)
    assert status == 0, log.getvalue()[-3000:]
    return [final_weights(tmp_path / f"{task}.npz") for task in (0, 1)]


def assert_same_weights(received, expected, **tolerance):
    assert len(received) == len(expected)
    for got, want in zip(received, expected):
        np.testing.assert_allclose(got, want, **tolerance)


def final_weights(path):
    with np.load(path) as saved:
        return [saved[f"arr_{index}"] for index in range(len(saved.files) - 1)], int(saved["iterations"])


@pytest.mark.slow
def test_two_workers_match_one_process_fit_with_the_global_batch(tmp_path):
    initial = initial_weights(tmp_path / "initial.npz")
    log = io.StringIO()
    status = launch.launch(
        [*WORKER, *worker_args(tmp_path, "--examples", "64", "--global-batch-size", "16")], 2, output=log
    )
    assert status == 0, log.getvalue()[-3000:]
    (chief, chief_steps), (other, other_steps) = (final_weights(tmp_path / f"{task}.npz") for task in (0, 1))
    assert chief_steps == other_steps == 64 // 16
    for chief_weight, other_weight in zip(chief, other):
        np.testing.assert_array_equal(chief_weight, other_weight)  # one all-reduced update, bit for bit

    reference = distributed_worker.build_model()
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss={"probability": keras.losses.BinaryCrossentropy()})
    features, labels = distributed_worker.data(64)
    reference.fit(features, {"probability": labels}, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for expected, received in zip(reference.get_weights(), chief):
        np.testing.assert_allclose(received, expected, rtol=1e-5, atol=1e-6)  # float32, summation order
    assert not np.allclose(chief[0], initial[0])  # it trained

    history = (tmp_path / "run" / "history.csv").read_text().splitlines()
    header = history[0].split(",")  # the one-machine run's format: epoch, then the logs by name
    assert header[0] == "epoch" and "probability_loss" in header and header[1:] == sorted(header[1:])
    assert len(history) == 2
    # Validation is global: the accuracy over all 64 examples with the final weights.
    predicted = reference.predict(features, verbose=0)["probability"][:, 0] > 0.5
    row = dict(zip(history[0].split(","), history[1].split(",")))
    np.testing.assert_allclose(float(row["val_probability_accuracy"]), np.mean(predicted == labels), atol=1e-6)
    assert (tmp_path / "run" / "best.weights.h5").is_file()
    assert "[worker 0] Epoch 1/1" in log.getvalue() and "[worker 1] Epoch" not in log.getvalue()


TRANSLATOR = ["--model", "translator", "--examples", "96", "--tokens-per-batch", "128"]


@pytest.fixture(scope="module")
def translator_run(tmp_path_factory):
    """`(directory, initial weights, chief's, other's)` of a float32 two-worker translator run."""
    from tests.translation_fixtures import require_data

    require_data()
    directory = tmp_path_factory.mktemp("translator")
    initial = initial_weights(directory / "initial.npz", build=lambda: distributed_worker.build_translator()[0])
    return directory, initial, *run_two_workers(directory, *TRANSLATOR)


@pytest.mark.slow
def test_two_translator_workers_match_one_process_fit_over_the_global_tokens(translator_run):
    from models.translator import TokenAccuracy
    from models.translator import translation_loss

    directory, initial, (chief, chief_steps), (other, other_steps) = translator_run
    reference, vectorizers = distributed_worker.build_translator()
    batches = distributed_worker.translation_batches(vectorizers, 96, 128)
    sizes = [int(targets.shape[0]) for _, targets in batches]
    assert 1 in sizes and any(size % 2 for size in sizes) and len(set(sizes)) > 2  # worker 1's share is sometimes empty
    assert chief_steps == other_steps == len(sizes)
    assert_same_weights(other, chief, rtol=0, atol=0)  # one all-reduced update, bit for bit

    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=translation_loss(), metrics=[TokenAccuracy()])
    reference.fit(batches, epochs=1, shuffle=False, verbose=0)
    assert_same_weights(chief, reference.get_weights(), rtol=1e-5, atol=1e-6)  # float32, summation order
    assert not np.allclose(chief[0], initial[0])  # it trained

    # Validation is global: accuracy and loss over every real target token of the set.
    history = list(csv.DictReader((directory / "run" / "history.csv").open()))
    expected = reference.evaluate(batches, return_dict=True, verbose=0)["token_accuracy"]
    np.testing.assert_allclose(float(history[0]["val_token_accuracy"]), expected, rtol=1e-6)
    loss, tokens = 0.0, 0
    for inputs, targets in batches:
        real = targets.numpy() != 0
        log_probabilities = reference_log_softmax(reference(inputs).numpy().astype("float64"))
        picked = np.take_along_axis(log_probabilities, targets.numpy()[..., None], -1)[..., 0]
        loss, tokens = loss - picked[real].sum(), tokens + real.sum()
    np.testing.assert_allclose(float(history[0]["val_loss"]), loss / tokens, rtol=1e-5)


def test_the_xla_step_gives_the_weights_of_keras_fit(tmp_path):
    """`jit_compile=True` XLA-compiles each replica's forward and backward pass; the weights stay those
    of one-process `fit` over the same global batches, as the plain step's (the classifier: one
    batch shape, one XLA compilation; the translator's buckets would compile once per shape)."""
    initial = initial_weights(tmp_path / "initial.npz")
    (chief, steps), (other, _) = run_two_workers(
        tmp_path, "--examples", "64", "--global-batch-size", "16", "--jit-compile"
    )
    assert steps == 64 // 16
    assert_same_weights(other, chief, rtol=0, atol=0)
    reference = distributed_worker.build_model()
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss={"probability": keras.losses.BinaryCrossentropy()})
    features, labels = distributed_worker.data(64)
    reference.fit(features, {"probability": labels}, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert_same_weights(chief, reference.get_weights(), rtol=1e-5, atol=1e-6)  # float32: XLA fuses and reorders sums
    assert not np.allclose(chief[0], initial[0])


@pytest.mark.slow
def test_mixed_float16_on_two_workers_stays_finite_and_close_to_float32(translator_run, tmp_path):
    _, initial, (float32, _), _ = translator_run
    np.savez(tmp_path / "initial.npz", *initial)
    (chief, chief_steps), (other, _) = run_two_workers(tmp_path, *TRANSLATOR, "--mixed-precision", "mixed_float16")
    assert_same_weights(other, chief, rtol=0, atol=0)
    assert all(np.isfinite(weight).all() for weight in chief)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(float32, initial))
    difference = max(float(np.abs(a - b).max()) for a, b in zip(chief, float32))
    assert difference < 0.02 * moved, (difference, moved)  # float16 activations and gradients


@pytest.mark.slow
def test_a_step_not_finite_on_one_worker_is_skipped_by_both_under_mixed_float16(tmp_path):
    """Worker 1's share of the first global batch holds an inf: both workers skip that step
    together (each LossScaleOptimizer alone would skip on worker 1 only, and worker 0 would wait
    in the all-reduce), then train on the other batches like float32 `fit` on those batches."""
    initial = initial_weights(tmp_path / "initial.npz")
    (chief, chief_steps), (other, other_steps) = run_two_workers(
        tmp_path,
        "--examples",
        "64",
        "--global-batch-size",
        "16",
        "--infinite-at",
        "15",
        "--mixed-precision",
        "mixed_float16",
    )
    assert chief_steps == other_steps == 64 // 16 - 1  # the skipped step does not count
    assert_same_weights(other, chief, rtol=0, atol=0)
    reference = distributed_worker.build_model()
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss={"probability": keras.losses.BinaryCrossentropy()})
    features, labels = distributed_worker.data(64)
    reference.fit(features[16:], {"probability": labels[16:]}, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert_same_weights(chief, reference.get_weights(), atol=2e-3)  # float16 activations


@pytest.mark.slow
def test_a_killed_worker_stops_the_other_and_the_rerun_resumes(tmp_path):
    initial_weights(tmp_path / "initial.npz")
    steps, timeout = 16, 10
    args = worker_args(
        tmp_path,
        "--examples",
        str(steps * 4),
        "--global-batch-size",
        "4",
        "--checkpoint-every",
        "2",
        "--stall-after",
        str(steps // 2),  # worker 1 stops mid-run, worker 0 waits for it in the all-reduce
        "--timeout",
        str(timeout),
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints every thread's stack
    workers = [
        subprocess.Popen(
            [*WORKER, *args],
            env={**env, "TF_CONFIG": config},
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for config in launch.tf_configs(2)
    ]
    checkpoints = tmp_path / "run" / "checkpoints"
    deadline = time.monotonic() + 120
    while not list(checkpoints.glob("ckpt-[4-9]*.index")) and time.monotonic() < deadline:
        assert all(worker.poll() is None for worker in workers)
        time.sleep(0.2)
    workers[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        status = workers[0].wait(timeout=timeout + 60)
    except subprocess.TimeoutExpired:  # a hang: where the survivor is stuck, then fail
        workers[0].send_signal(signal.SIGABRT)
        workers[0].wait(timeout=30)
        pytest.fail(f"the survivor still ran {timeout + 60} s after the kill:\n{workers[0].stdout.read()[-6000:]}")
    finally:
        for worker in workers:
            worker.kill()
    waited = time.monotonic() - killed
    print(f"the survivor exited {waited:.1f} s after the kill")
    output = workers[0].stdout.read()
    assert status != 0, output[-3000:]
    assert waited < timeout + 60, waited
    assert "WorkerLostError" in output or "Rerun the same command" in output, output[-3000:]
    interrupted_at = max(int(path.name[5:].split(".")[0]) for path in checkpoints.glob("ckpt-*.index"))
    assert 0 < interrupted_at < steps

    log = io.StringIO()
    rerun = worker_args(
        tmp_path,
        "--examples",
        str(steps * 4),
        "--global-batch-size",
        "4",
        "--checkpoint-every",
        "2",
        "--timeout",
        str(timeout),
    )
    assert launch.launch([*WORKER, *rerun], 2, output=log) == 0, log.getvalue()[-3000:]
    assert f"resumed after step {interrupted_at}" in log.getvalue()
    for task in (0, 1):  # the step counter went on: every step trained exactly once
        assert final_weights(tmp_path / f"{task}.npz")[1] == steps


EXIT_PROBE = """
import atexit, sys
from pipelines import distributed
atexit.register(lambda: print("interpreter shutdown ran", flush=True))
with distributed.exit_when_a_worker_is_lost():
    raise {error}
"""


@pytest.mark.slow
def test_a_lost_worker_ends_the_process_at_once_and_other_errors_pass_through():
    """After a `WorkerLostError` the process exits 1 with its traceback and skips the interpreter's
    shutdown (where a tf.data teardown can hang); any other error takes the normal way out."""

    def run(error):
        return subprocess.run(
            [sys.executable, "-c", EXIT_PROBE.format(error=error)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    lost = run("distributed.WorkerLostError('the peer at 127.0.0.1:1234 stopped answering')")
    assert lost.returncode == 1, lost.stderr[-2000:]
    assert "WorkerLostError: the peer at 127.0.0.1:1234 stopped answering" in lost.stderr
    assert "interpreter shutdown ran" not in lost.stdout
    other = run("ValueError('`epochs` must be positive. Received: epochs=0')")
    assert other.returncode == 1 and "ValueError: `epochs` must be positive" in other.stderr
    assert "interpreter shutdown ran" in other.stdout


@pytest.mark.slow
def test_main_job_on_two_workers_exports_from_the_chief(small_imdb_archive, imdb_cache_dir, tmp_path):
    """Over a minute: two worker processes each import TensorFlow and train, then the chief exports
    and verifies in fresh processes, as a one-machine main job does."""
    imdb_data.load_cache(small_imdb_archive, imdb_cache_dir, allow_download=False)  # decoded once, before the workers
    run_dir, export_dir = tmp_path / "run", tmp_path / "export"
    command = [
        sys.executable,
        "-m",
        "pipelines.main_job",
        "--smoke",
        "--data",
        str(small_imdb_archive),
        "--cache-dir",
        str(imdb_cache_dir),
        "--no-download",
        "--output-dir",
        str(run_dir),
        "--export-dir",
        str(export_dir),
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--strategy",
        "multi_worker",
    ]
    log = io.StringIO()
    assert launch.launch(command, 2, output=log) == 0, log.getvalue()[-3000:]
    summary = json.loads((run_dir / "main_job.json").read_text())
    training = json.loads((run_dir / "summary.json").read_text())
    assert training["strategy"] == "multi_worker" and training["replicas"] == 2 and training["epochs_run"] == 1
    assert training["data"]["train"] == 300 - train_imdb.SMOKE_DATA["validation_size"]
    assert 0.0 <= training["test_accuracy"] <= 1.0 and training["test_loss"] > 0
    # The same verification as a one-machine run: a fresh-process SavedModel reload, saved_model_cli, ONNX.
    assert summary["exports"]["savedmodel"] == str(export_dir / "imdb_sentiment" / "1")
    for key in ("savedmodel_fresh_process_max_abs_diff", "saved_model_cli_max_abs_diff", "onnx_max_abs_diff"):
        assert summary["exports"]["parity"][key] <= 1e-5
    assert list((run_dir / "checkpoints").glob("ckpt-*.index")) and (run_dir / "best.weights.h5").is_file()
    assert "[worker 1]" in log.getvalue() and "[worker 0] Epoch 1/1" in log.getvalue()


@pytest.mark.slow
def test_translator_on_two_workers_exports_from_the_chief_like_one_machine(tmp_path):
    """Over a minute: two worker processes train the translator, then its export is verified
    token for token in a fresh process and through ONNX."""
    from contextlib import redirect_stdout

    from export.translator import verified_export
    from tests.translation_fixtures import require_data

    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "pipelines.train_translator",
        "--data",
        str(require_data()),
        "--smoke",
        "--strategy",
        "multi_worker",
        "--epochs",
        "1",
        "--max-pairs",
        "300",
        "--max-test",
        "8",
        "--output-dir",
        str(run_dir),
    ]
    log = io.StringIO()
    assert launch.launch(command, 2, output=log) == 0, log.getvalue()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["strategy"] == "multi_worker" and summary["replicas"] == 2 and summary["epochs_run"] == 1
    assert 0.0 < summary["test_token_accuracy"] < 1.0 and summary["bleu_sentences"] == 8
    assert list((run_dir / "checkpoints").glob("ckpt-*.index")) and (run_dir / "best.weights.h5").is_file()
    assert "[worker 0] Epoch 1/1" in log.getvalue() and "[worker 1] Epoch" not in log.getvalue()
    # Each worker prints its summary; the non-chief has no history of its own but started fresh too.
    assert log.getvalue().count('"resumed_from_epoch": null') == 2, log.getvalue()[-3000:]
    # The same verification as a one-machine run: a fresh-process SavedModel reload and ONNX, token for token.
    printed = io.StringIO()
    with redirect_stdout(printed):
        verified_export.main(
            ["--run", str(run_dir), "--export-dir", str(tmp_path / "export"), "--verify-sentences", "16"]
        )
    report = json.loads(printed.getvalue())
    assert report == {
        "export": str(tmp_path / "export" / "translator" / "1"),
        "sentences": 16,
        "saved_model_matches": True,
        "onnx_matches": True,
    }


@pytest.mark.slow
def test_the_multi_worker_benchmark_smoke_run(tmp_path, monkeypatch, capsys, small_imdb_archive, imdb_cache_dir):
    """Over a minute: the benchmark starts a two-worker cluster (each worker imports TensorFlow) and
    times its steps against one machine. Here, not in tests/test_benchmarks.py: its clusters run one
    after the other with the ones above."""
    assert_smoke_run("multi_worker", tmp_path, capsys, monkeypatch, small_imdb_archive, imdb_cache_dir)
