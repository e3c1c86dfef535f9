"""Tiny training runs under `pipelines.resumable_training.training_callbacks`, each killed with SIGKILL at a
chosen step of an epoch: the subprocess of the kill tests (tests/test_resume.py).

    python -m tests.resume_driver SCENARIOS.json

SCENARIOS.json is a list of scenarios. Each holds `output_dir`, `epochs`, `val_losses` (each epoch's monitored `val_loss`, so
the best epoch is known), `patience` and `attempts`, one `[step, epoch]` kill point (or `null`:
run to the end) per run of the same command. `step` is `mid_epoch` or a step that
`ResumableTraining._reached` names. Keras and TensorFlow are imported once; each attempt is a
forked child (no TensorFlow op has run in the parent), so a kill is a real `kill -9` of a
training process. Every epoch's weights are kept in `<output_dir>/../record/epoch-E.npz` (the
last attempt's) for the test to compare with `best.weights.h5`, and `history.csv` and
`best.weights.h5` as each attempt resumed in `<output_dir>/../snapshots/attempt-K/`. Prints a JSON list, per scenario
a list with, per attempt, the signal that ended it (`null`: exit 0), its output, and its summary (`epochs_run`,
`resumed_from_epoch`, ... computed as the training CLIs compute them).
"""

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import keras
import numpy as np

from pipelines import resumable_training

STEPS_PER_EPOCH = 4


class ScriptedMonitor(keras.callbacks.Callback):
    """Sets `val_loss` to the scripted value, records the epoch's weights, kills mid-epoch if told."""

    def __init__(self, val_losses, record_dir, kill):
        super().__init__()
        self.val_losses, self.record_dir, self.kill = val_losses, record_dir, kill

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.kill == ("mid_epoch", self._epoch) and batch == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = self.val_losses[epoch]
        self.record_dir.mkdir(exist_ok=True)
        np.savez(self.record_dir / f"epoch-{epoch}.npz", *self.model.get_weights())


class Snapshot(keras.callbacks.Callback):
    """Copies `history.csv` and `best.weights.h5` as the run resumes (after `ResumableTraining`
    restored them): what a reader sees between the restart and the first new epoch."""

    def __init__(self, output_dir, snapshot_dir):
        super().__init__()
        self.output_dir, self.snapshot_dir = output_dir, snapshot_dir

    def on_train_begin(self, logs=None):
        self.snapshot_dir.mkdir(parents=True)
        for name in (resumable_training.HISTORY_CSV, resumable_training.BEST_WEIGHTS):
            if (self.output_dir / name).is_file():
                shutil.copyfile(self.output_dir / name, self.snapshot_dir / name)


def kill_at(kill):
    """Makes `ResumableTraining` SIGKILL its process right after step `kill = (step, epoch)`."""
    original = resumable_training.ResumableTraining._reached

    def reached(self, step, epoch):
        original(self, step, epoch)
        if (step, epoch) == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    resumable_training.ResumableTraining._reached = reached


def build_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def train(scenario, kill, attempt):
    """One run of the command; returns its summary."""
    output_dir = Path(scenario["output_dir"])
    if kill is not None and kill[0] != "mid_epoch":
        kill_at(kill)
    keras.utils.set_random_seed(0)
    features = np.random.default_rng(0).normal(size=(8 * STEPS_PER_EPOCH, 3)).astype("float32")
    targets = features @ np.array([[1.0], [-2.0], [0.5]], "float32")
    model = build_model()
    callbacks = resumable_training.training_callbacks(
        output_dir, monitor="val_loss", mode="min", patience=scenario["patience"]
    )
    monitor = ScriptedMonitor(scenario["val_losses"], output_dir.parent / "record", kill)
    callbacks.insert(-1, monitor)  # before ResumableTraining: it commits the scripted value
    callbacks.append(Snapshot(output_dir, output_dir.parent / "snapshots" / f"attempt-{attempt}"))
    history = model.fit(features, targets, batch_size=8, epochs=scenario["epochs"], callbacks=callbacks, verbose=0)
    epochs = resumable_training.read_history(output_dir)
    return {
        "epochs_run": len(epochs),
        "epochs_this_invocation": len(history.epoch),
        "resumed_from_epoch": resumable_training.resumed_from_epoch(len(epochs), len(history.epoch)),
        "optimizer_iterations": int(model.optimizer.iterations.numpy()),
    }


def run_attempt(scenario, kill, attempt):
    """Forks a child that trains with its output in `log_path`; returns (signal or None, summary)."""
    log_path = Path(scenario["output_dir"]).parent / f"attempt-{attempt}.log"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with open(log_path, "w") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                summary = train(scenario, kill, attempt)
                print("SUMMARY " + json.dumps(summary), flush=True)
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    text = Path(log_path).read_text()
    summary = [json.loads(line[8:]) for line in text.splitlines() if line.startswith("SUMMARY ")]
    killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if killed_by is None and os.WEXITSTATUS(status) != 0:
        raise RuntimeError(f"attempt {kill} failed:\n{text[-3000:]}")
    return {"signal": killed_by, "output": text, "summary": summary[0] if summary else None}


def run_scenario(scenario):
    reports = []
    for attempt, kill in enumerate(scenario["attempts"]):
        reports.append(run_attempt(scenario, None if kill is None else tuple(kill), attempt))
    return reports


def main(scenarios_path):
    print(json.dumps([run_scenario(scenario) for scenario in json.loads(Path(scenarios_path).read_text())]))


if __name__ == "__main__":
    main(sys.argv[1])
