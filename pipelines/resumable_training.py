"""One-machine training that survives a kill: the callbacks of `model.fit` and the run's files.

`training_callbacks` gives `fit` an epoch timer, TensorBoard and `ResumableTraining` (backup,
best checkpoint, early stopping and CSV history, committed once per epoch), so rerunning the same
command resumes; `read_history`, `restore_best_weights` and `read_training_state` read back what
a run left in its directory (`pipelines.distributed` writes the same `history.csv` and
`best.weights.h5` for a multi-worker run). `pipelines.training.fit` uses them.
"""

import csv
import json
import math
import shutil
import time
from pathlib import Path

import keras

from appkit.files import reading
from appkit.files import replacing
from appkit.files import write_json_atomic

BEST_WEIGHTS = "best.weights.h5"
HISTORY_CSV = "history.csv"
BACKUP_DIR = "backup"
TRAINING_STATE = "training_state.json"


def read_history(output_dir):
    """Epoch logs of the run in `output_dir`, one row per finished epoch (a resumed run's earlier
    epochs included, none twice): `history.csv`, republished from the committed training state."""
    path = Path(output_dir) / HISTORY_CSV
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(file)]


class EpochTimer(keras.callbacks.Callback):
    """Adds `epoch_seconds` (wall time of the epoch, validation included) to the epoch logs."""

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["epoch_seconds"] = time.perf_counter() - self._started


def training_callbacks(output_dir, monitor="val_accuracy", mode="max", patience=2):
    """Epoch timer, TensorBoard and `ResumableTraining` (backup, best checkpoint, early stopping,
    CSV history, committed once per epoch).

    Rerunning the same command after a crash or a kill resumes from the last committed epoch and
    says so; rerunning a finished run trains nothing more. The history also records each epoch's
    duration (`epoch_seconds`), so time and throughput add up across resumes. The progress bar
    is `fit(verbose=1)`'s own.
    """
    output_dir = Path(output_dir)
    return [
        EpochTimer(),  # before ResumableTraining: the committed row holds `epoch_seconds`
        keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard")),
        ResumableTraining(output_dir, monitor=monitor, mode=mode, patience=patience),
    ]


def resumed_from_epoch(epochs_run, epochs_this_invocation):
    """The epochs a run found done when it started (`None`: it started from scratch)."""
    return (epochs_run - epochs_this_invocation) or None


class ResumableTraining(keras.callbacks.Callback):
    """Backup and restore, best checkpoint, early stopping and CSV history as one commit per epoch.

    At the end of epoch `N` (1-based), in this order:

    1. the model's weights, optimizer included, go to a new file `backup/epoch-N.weights.h5`;
    2. `backup/training_state.json` is replaced atomically: the epochs done, every epoch's logs
       and the best epoch so far (strictly better `monitor`). This is the commit;
    3. `history.csv` and, when epoch `N` is the new best, `best.weights.h5` are replaced
       atomically from that state;
    4. the weight files the state no longer names are removed.

    A kill before step 2 loses only the unfinished epoch: the rerun trains it again from the
    previous commit, and the history never holds it twice. A kill after step 2 loses nothing: the
    rerun republishes steps 3 and 4 from the state before it trains. So `history.csv` has one row
    per committed epoch and `best.weights.h5` holds the weights of the best committed epoch,
    wherever the kill landed. Early stopping (`patience` epochs without improvement, as
    `keras.callbacks.EarlyStopping`) is decided from the committed history, so a resumed run
    stops where an uninterrupted one would. A resumed run prints one line saying so.

    `_reached(step, epoch)` is called after each step: a seam for the kill tests
    (tests/test_resume.py); it does nothing.
    """

    def __init__(self, output_dir, monitor="val_accuracy", mode="max", patience=2):
        super().__init__()
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max'. Received: mode={mode!r}")
        self.output_dir = Path(output_dir)
        self.backup_dir = self.output_dir / BACKUP_DIR
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.state = None

    def on_train_begin(self, logs=None):
        self.state = read_training_state(self.output_dir)
        if self.state is None:
            self._refuse_foreign_run()
            self.state = {"epochs": 0, "weights": None, "history": [], "best_epoch": None}
            return
        weights = self.backup_dir / self.state["weights"]
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        with reading(weights, _start_over(self.output_dir)):
            self.model.load_weights(str(weights))
        self._publish()
        self._remove_unreferenced()
        done, epochs = self.state["epochs"], self.params.get("epochs", self.state["epochs"])
        stopped = self._stops_early()
        self.model._initial_epoch = epochs if stopped else done  # what keras.callbacks.BackupAndRestore sets
        best = self.state["best_epoch"]
        best_text = "none" if best is None else f"epoch {best + 1}, {self.monitor}={self._value(best):.6g}"
        left = "early stopping had ended it" if stopped else f"training epochs {done + 1} to {epochs}"
        if not stopped and done >= epochs:
            left = "nothing left to train"
        print(f"Resuming {self.output_dir}: {done} epochs done (best {best_text}); {left}.", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self.monitor not in logs:
            raise ValueError(
                f"`monitor` must be one of the epoch logs {sorted(logs)}. Received: monitor={self.monitor!r}"
            )
        done = epoch + 1
        weights = f"epoch-{done}.weights.h5"
        with replacing(self.backup_dir / weights, suffix=".weights.h5") as temporary:
            self.model.save_weights(str(temporary))
        self._reached("weights_saved", epoch)
        history = self.state["history"] + [{"epoch": epoch, **{key: float(value) for key, value in logs.items()}}]
        best = self.state["best_epoch"]
        if self._improves(history[-1][self.monitor], best, history):
            best = len(history) - 1
        state = {"epochs": done, "weights": weights, "history": history, "best_epoch": best}
        write_json_atomic(self.backup_dir / TRAINING_STATE, state)
        self.state = state
        self._reached("committed", epoch)
        self._publish(best_changed=best == len(history) - 1)
        self._remove_unreferenced()
        if self._stops_early():
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.model._initial_epoch = None  # a later fit() of the same model starts where it is told

    def _reached(self, step, epoch):
        """Called after each step of the epoch's commit (see the class docstring); does nothing."""

    def _value(self, index):
        return self.state["history"][index][self.monitor]

    def _improves(self, value, best, history):
        if math.isnan(value):
            return False
        if best is None:
            return True
        return value > history[best][self.monitor] if self.mode == "max" else value < history[best][self.monitor]

    def _stops_early(self):
        """`keras.callbacks.EarlyStopping`'s rule on the committed history."""
        history, best = self.state["history"], self.state["best_epoch"]
        if len(history) < 2:
            return False
        since_best = len(history) - 1 - (-1 if best is None else best)
        return since_best >= self.patience

    def _best_weights_file(self):
        best = self.state["best_epoch"]
        return None if best is None else f"epoch-{best + 1}.weights.h5"

    def _publish(self, best_changed=True):
        """`history.csv` and `best.weights.h5` from the committed state (steps 3 of the commit)."""
        write_history(self.output_dir / HISTORY_CSV, self.state["history"])
        self._reached("history_written", self.state["epochs"] - 1)
        best = self._best_weights_file()
        if best is not None and best_changed:
            with replacing(self.output_dir / BEST_WEIGHTS, suffix=".weights.h5") as temporary:
                shutil.copyfile(self.backup_dir / best, temporary)
            self._reached("best_written", self.state["epochs"] - 1)

    def _remove_unreferenced(self):
        """Step 4: weight files of older epochs and of a killed, uncommitted one; stale temporaries."""
        keep = {self.state["weights"], self._best_weights_file(), TRAINING_STATE}
        for path in self.backup_dir.iterdir():
            if path.name not in keep:
                path.unlink()
        for path in self.output_dir.glob(f".{BEST_WEIGHTS}.*"):
            path.unlink()

    def _refuse_foreign_run(self):
        """A fresh run never overwrites the history of a run it cannot resume."""
        history = self.output_dir / HISTORY_CSV
        if history.is_file() or self.backup_dir.is_dir() and any(self.backup_dir.iterdir()):
            raise ValueError(
                f"`output_dir` holds a training run without {BACKUP_DIR}/{TRAINING_STATE} (from another "
                f"version or another strategy): it cannot be resumed. Choose a new output directory or remove "
                f"it. Received: output_dir={str(self.output_dir)!r}"
            )


def read_training_state(output_dir):
    """The committed state of the run in `output_dir` (`ResumableTraining`), or `None`."""
    path = Path(output_dir) / BACKUP_DIR / TRAINING_STATE
    if not path.is_file():
        return None
    with reading(path, _start_over(output_dir)):
        return json.loads(path.read_text())


def _start_over(output_dir):
    return f"delete {Path(output_dir)} (or pass another --output-dir) to train from the start"


def write_history(path, history):
    """Rewrites the CSV `path` (atomically) with one row per epoch, `epoch` first."""
    columns = ["epoch", *sorted({key for row in history for key in row} - {"epoch"})]
    with replacing(path, suffix=".csv") as temporary:
        with open(temporary, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows({**row, "epoch": int(row["epoch"])} for row in history)


def restore_best_weights(model, output_dir):
    """Loads the best checkpoint written by `training_callbacks`, if there is one."""
    path = Path(output_dir) / BEST_WEIGHTS
    if path.is_file():
        with reading(path, _start_over(output_dir)):
            model.load_weights(str(path))
    return path
