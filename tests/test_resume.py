"""Kill tests of the one-machine training loop (`pipelines.resumable_training.training_callbacks`): a training
process is SIGKILLed at several points of the epoch loop, the same command is rerun, and the run
must come out as if nothing happened: one history row per epoch, none twice, `epochs_run` and
`resumed_from_epoch` right, the optimizer's step count that of the epochs trained once each,
`best.weights.h5` the weights of the best epoch, and each rerun saying that it resumed.

The runs are tiny (`tests/resume_driver.py`: a two-layer model, 4 steps per epoch, a scripted
validation loss so the best epoch is known), forked from one process that imported TensorFlow
once.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines import resumable_training
from tests import resume_driver

REPO_ROOT = Path(__file__).resolve().parents[1]
# Epochs a kill at (step, epoch) leaves committed: the epoch counts once its state is written.
COMMITTED_AFTER = {"mid_epoch": 0, "weights_saved": 0, "committed": 1, "history_written": 1, "best_written": 1}
SCENARIOS = {
    # Every kill point once, each rerun resuming the previous kill's leftovers. The best epoch
    # moves (1, 2, 4, 6): after `committed` and `history_written` the new best checkpoint is not
    # yet written, after `best_written` it is.
    "every_step": {
        "epochs": 7,
        "val_losses": [0.5, 0.3, 0.4, 0.2, 0.35, 0.1, 0.3],
        "patience": 10,
        "attempts": [
            ["mid_epoch", 1],
            ["weights_saved", 1],
            ["committed", 1],
            ["history_written", 3],
            ["best_written", 5],
            None,
        ],
    },
    # Killed once early stopping had decided (patience 2, best epoch 2): the rerun trains nothing.
    "early_stopped": {
        "epochs": 6,
        "val_losses": [0.5, 0.3, 0.4, 0.45, 0.2, 0.1],
        "patience": 2,
        "attempts": [["committed", 3], None],
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`{name: (output_dir, reports)}` of every scenario, run by one driver process."""
    root = tmp_path_factory.mktemp("resume")
    scenarios = [{**scenario, "output_dir": str(root / name / "run")} for name, scenario in SCENARIOS.items()]
    for scenario in scenarios:
        Path(scenario["output_dir"]).parent.mkdir()
    (root / "scenarios.json").write_text(json.dumps(scenarios))
    result = subprocess.run(
        [sys.executable, "-m", "tests.resume_driver", str(root / "scenarios.json")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        name: (Path(scenario["output_dir"]), report) for name, scenario, report in zip(SCENARIOS, scenarios, reports)
    }


def _expected_epochs_done(attempts):
    """Epochs committed when each attempt starts, from the kill points alone."""
    done, expected = 0, []
    for kill in attempts:
        expected.append(done)
        if kill is not None:
            step, epoch = kill
            done = epoch + COMMITTED_AFTER[step]
    return expected


def _weights(path):
    model = resume_driver.build_model()
    model.optimizer.build(model.trainable_variables)
    model.load_weights(str(path))
    return model.get_weights()


def _check_best_weights(path, record_dir, best_epoch):
    recorded = np.load(record_dir / f"epoch-{best_epoch}.npz")
    for got, want in zip(_weights(path), [recorded[f"arr_{i}"] for i in range(len(recorded.files))]):
        np.testing.assert_array_equal(got, want)


def _best(val_losses):
    return int(np.argmin(val_losses))  # the first of equals, as the strict improvement rule


def _check_resumed_run(output_dir, reports, scenario, epochs_run, best_epoch):
    attempts = scenario["attempts"]
    assert [report["signal"] for report in reports] == [9] * (len(attempts) - 1) + [None]
    for attempt, (report, done) in enumerate(zip(reports, _expected_epochs_done(attempts))):
        said = [line for line in report["output"].splitlines() if line.startswith("Resuming ")]
        assert len(said) == (0 if done == 0 else 1)
        if done:
            best = _best(scenario["val_losses"][:done])
            best_text = f"best epoch {best + 1}, val_loss={scenario['val_losses'][best]:.6g}"
            assert said[0].startswith(f"Resuming {output_dir}: {done} epochs done ({best_text}); ")
        if done:  # what the rerun republished before training: the committed epochs and their best
            snapshot = output_dir.parent / "snapshots" / f"attempt-{attempt}"
            assert [int(row["epoch"]) for row in resumable_training.read_history(snapshot)] == list(range(done))
            _check_best_weights(
                snapshot / resumable_training.BEST_WEIGHTS,
                output_dir.parent / "record",
                _best(scenario["val_losses"][:done]),
            )
    history = resumable_training.read_history(output_dir)
    assert [int(row["epoch"]) for row in history] == list(range(epochs_run))  # one row each, none twice
    assert [row["val_loss"] for row in history] == scenario["val_losses"][:epochs_run]
    _check_best_weights(output_dir / resumable_training.BEST_WEIGHTS, output_dir.parent / "record", best_epoch)
    hidden = [path.name for path in output_dir.rglob(".*")]
    assert hidden == []  # no temporary file left behind


def test_every_kill_point_resumes_without_losing_or_repeating_an_epoch(runs):
    output_dir, reports = runs["every_step"]
    scenario = SCENARIOS["every_step"]
    _check_resumed_run(output_dir, reports, scenario, epochs_run=7, best_epoch=5)
    summary = reports[-1]["summary"]
    assert summary == {
        "epochs_run": 7,
        "epochs_this_invocation": 1,
        "resumed_from_epoch": 6,
        "optimizer_iterations": 7 * resume_driver.STEPS_PER_EPOCH,  # each epoch trained once into the weights
    }
    state = resumable_training.read_training_state(output_dir)
    assert state["epochs"] == 7 and state["best_epoch"] == 5
    assert sorted(path.name for path in (output_dir / "backup").iterdir()) == [
        "epoch-6.weights.h5",
        "epoch-7.weights.h5",
        "training_state.json",
    ]


def test_a_kill_after_early_stopping_decided_trains_nothing_more(runs):
    output_dir, reports = runs["early_stopped"]
    _check_resumed_run(output_dir, reports, SCENARIOS["early_stopped"], epochs_run=4, best_epoch=1)
    assert "early stopping had ended it" in reports[-1]["output"]
    assert reports[-1]["summary"]["epochs_this_invocation"] == 0
    assert reports[-1]["summary"]["resumed_from_epoch"] == 4
