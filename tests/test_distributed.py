"""Multi-worker training on two loopback workers (`pipelines.distributed`, `pipelines.launch`).

The oracle for the distributed step is Keras's own `fit` in one process: two workers with a
global batch of 2b (b each) must end with the weights of one `fit` with batch 2b over the same
batches, and with identical weights on both workers.
"""

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
from tests.imdb_fixtures import imdb_cache_dir  # noqa: F401
from tests.imdb_fixtures import small_imdb_archive  # noqa: F401

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = [sys.executable, "-m", "tests.distributed_worker"]


def initial_weights(path):
    keras.utils.set_random_seed(0)
    weights = distributed_worker.build_model().get_weights()
    np.savez(path, *weights)
    return weights


def worker_args(tmp_path, *extra):
    return ["--output-dir", str(tmp_path / "run"), "--initial", str(tmp_path / "initial.npz"),
            "--weights-out", str(tmp_path), *extra]


def final_weights(path):
    with np.load(path) as saved:
        return [saved[f"arr_{index}"] for index in range(len(saved.files) - 1)], int(saved["iterations"])


def test_two_workers_match_one_process_fit_with_the_global_batch(tmp_path):
    initial = initial_weights(tmp_path / "initial.npz")
    log = io.StringIO()
    status = launch.launch([*WORKER, *worker_args(tmp_path, "--examples", "64", "--global-batch-size", "16")], 2,
                           output=log)
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
    assert history[0].split(",")[:2] == ["epoch", "probability_loss"] and len(history) == 2
    assert (tmp_path / "run" / "best.weights.h5").is_file()
    assert "[worker 0] Epoch 1/1" in log.getvalue() and "[worker 1] Epoch" not in log.getvalue()


def test_a_killed_worker_stops_the_other_and_the_rerun_resumes(tmp_path):
    initial_weights(tmp_path / "initial.npz")
    steps, timeout = 16, 10
    args = worker_args(tmp_path, "--examples", str(steps * 4), "--global-batch-size", "4", "--checkpoint-every", "2",
                       "--seconds-per-batch", "0.3", "--timeout", str(timeout))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = [
        subprocess.Popen([*WORKER, *args], env={**env, "TF_CONFIG": config}, cwd=REPO_ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    rerun = worker_args(tmp_path, "--examples", str(steps * 4), "--global-batch-size", "4", "--checkpoint-every", "2",
                        "--timeout", str(timeout))
    assert launch.launch([*WORKER, *rerun], 2, output=log) == 0, log.getvalue()[-3000:]
    assert f"resumed after step {interrupted_at}" in log.getvalue()
    for task in (0, 1):  # the step counter went on: every step trained exactly once
        assert final_weights(tmp_path / f"{task}.npz")[1] == steps


@pytest.mark.parametrize("flags", [["--jit-compile"], ["--mixed-precision", "mixed_float16"]])
def test_multi_worker_rejects_what_its_step_does_not_do(flags, capsys):
    with pytest.raises(SystemExit):
        train_imdb.parse_args(["--strategy", "multi_worker", *flags])
    assert "--strategy multi_worker supports neither" in capsys.readouterr().err


def test_main_job_on_two_workers_exports_from_the_chief(small_imdb_archive, imdb_cache_dir, tmp_path):
    imdb_data.load_cache(small_imdb_archive, imdb_cache_dir, allow_download=False)  # decoded once, before the workers
    run_dir, export_dir = tmp_path / "run", tmp_path / "export"
    command = [sys.executable, "-m", "pipelines.main_job", "--smoke", "--data", str(small_imdb_archive),
               "--cache-dir", str(imdb_cache_dir), "--no-download", "--output-dir", str(run_dir),
               "--export-dir", str(export_dir), "--epochs", "1", "--batch-size", "16", "--strategy", "multi_worker"]
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
