"""Multi-worker training: the cluster from `TF_CONFIG`, a training step of our own, fault tolerance.

Why not `model.fit`: under `MultiWorkerMirroredStrategy` Keras 3's trainer fails
(keras-team/keras#20585, tensorflow#72388): its symbolic build calls `strategy.reduce("MEAN", ...)`
eagerly on a `PerReplica` value and `reduce_per_replica` reduces scalar metrics along axis 0 in
multi-worker mode. A step under `strategy.run` that scales each replica's loss with
`tf.nn.compute_average_loss` by the *global* batch and SUM-reduces its statistics trains
correctly; `fit_distributed` wraps it in what `fit` gives: a progress bar and TensorBoard on the
chief, the same per-output losses and accuracies, validation over the whole validation set, the
best weights, early stopping, a CSV history, and checkpoints every N steps and every epoch.

    strategy = multi_worker_strategy()            # reads TF_CONFIG
    with strategy.scope():
        model = build(...)                        # outputs: a dict of named tensors
        optimizer = keras.optimizers.AdamW(...)   # built inside the scope
    history = fit_distributed(strategy, model, optimizer, losses, metrics, train_data, validation,
                              epochs=2, global_batch_size=64, output_dir=output_dir)

Every worker runs the same command. Only the chief (task `chief`, or `worker` 0 without one)
writes under `output_dir`; the others write their checkpoints to a temporary directory of their
own, as TensorFlow's guide requires (saving is a collective: every worker saves). A rerun
restores the chief's latest checkpoint (on a real cluster `output_dir` must be on a file system
every worker reads), skips the steps of the interrupted epoch already trained, and goes on: the
optimizer's step counter continues. A lost worker makes the others' collectives fail within
`timeout_seconds`: they exit with an error, never hang.
"""

import contextlib
import csv
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import keras
import tensorflow as tf

from models.cli import positive_int
from pipelines import common

MULTI_WORKER = "multi_worker"
TIMEOUT_SECONDS = 60
CHECKPOINT_EVERY = 100
CHECKPOINTS = "checkpoints"


class WorkerLostError(RuntimeError):
    """A collective did not complete: another worker died or stopped answering."""


def add_strategy_arguments(parser):
    """`--strategy` (`common.STRATEGIES` or `multi_worker`), `--checkpoint-every`, `--collective-timeout`."""
    parser.add_argument(
        "--strategy", choices=(*common.STRATEGIES, MULTI_WORKER), default="default",
        help="multi_worker: MultiWorkerMirroredStrategy over the TF_CONFIG cluster (see pipelines.launch)",
    )
    parser.add_argument(
        "--checkpoint-every", type=positive_int, default=CHECKPOINT_EVERY,
        help="multi_worker: training steps between checkpoints (also one per epoch)",
    )
    parser.add_argument(
        "--collective-timeout", type=positive_int, default=TIMEOUT_SECONDS,
        help="multi_worker: seconds before a collective with a lost worker fails",
    )


def cluster_task():
    """`(task_type, task_id, worker_count)` from `TF_CONFIG`; a clear error when it is missing or wrong."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(
            "`--strategy multi_worker` needs the cluster in the TF_CONFIG environment variable, e.g. "
            '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}} '
            "(or start the workers with `python -m pipelines.launch`). Received: TF_CONFIG unset"
        )
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
        return task["type"], int(task["index"]), workers
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"TF_CONFIG must hold 'cluster' and 'task' ({error}). Received: TF_CONFIG={raw!r}") from None


def is_chief(task_type, task_id):
    """The chief writes summaries, checkpoints and exports: task `chief`, or `worker` 0 when there is none."""
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and "chief" not in cluster)


def multi_worker_strategy(timeout_seconds=TIMEOUT_SECONDS):
    """`MultiWorkerMirroredStrategy` over the `TF_CONFIG` cluster; collectives time out after `timeout_seconds`."""
    cluster_task()  # the clear error before TensorFlow's
    if timeout_seconds <= 0:
        raise ValueError(f"`timeout_seconds` must be positive. Received: timeout_seconds={timeout_seconds}")
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def worker_output_dir(output_dir):
    """`output_dir` on the chief; a fresh temporary directory on every other worker."""
    task_type, task_id, _ = cluster_task()
    if is_chief(task_type, task_id):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        return Path(output_dir)
    return Path(tempfile.mkdtemp(prefix=f"keras_attn-{task_type}{task_id}-"))


def per_example_losses(**losses):
    """`{output: loss}` with each Keras loss returning one value per example (no reduction)."""
    for loss in losses.values():
        loss.reduction = None
    return losses


def accuracy(output):
    """A metric entry for `fit_distributed`: the binary accuracy of `output`, one value per example."""
    return output, keras.metrics.binary_accuracy


class _Statistics:
    """Per-replica sums of the losses and metrics of one batch; `logs` turns global sums into means."""

    def __init__(self, losses, metrics):
        self.losses, self.metrics = losses, metrics
        self.names = [f"{name}_loss" for name in losses] + ["loss", *metrics]

    def __call__(self, targets, outputs):
        sums = {"examples": tf.cast(tf.shape(next(iter(targets.values())))[0], tf.float32)}
        total = 0.0
        for name, loss in self.losses.items():
            per_example = tf.cast(loss(targets[name], outputs[name]), tf.float32)  # (batch,)
            sums[f"{name}_loss"] = tf.reduce_sum(per_example)
            total += per_example
        sums["loss"] = tf.reduce_sum(total)
        for name, (output, metric) in self.metrics.items():
            sums[name] = tf.reduce_sum(tf.cast(metric(targets[output], outputs[output]), tf.float32))
        return sums, total

    def logs(self, sums, prefix=""):
        examples = max(float(sums["examples"]), 1.0)
        return {prefix + name: float(value) / examples for name, value in sums.items() if name != "examples"}


def _add(totals, sums):
    return {name: totals.get(name, 0.0) + float(value) for name, value in sums.items()}


def _sharded(dataset):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


@contextlib.contextmanager
def collectives():
    """A collective that failed or timed out inside becomes a `WorkerLostError` saying what to do."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
            tf.errors.InternalError, tf.errors.AbortedError) as error:
        raise WorkerLostError(
            "a collective with the other workers failed or timed out: a worker died or stopped answering. "
            "Rerun the same command on every worker to resume from the last checkpoint. "
            f"Received: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error


class DistributedTrainer:
    """The replica step (`strategy.run`, loss averaged over the global batch, SUM-reduced sums) and
    a global evaluation; `fit_distributed` drives it."""

    def __init__(self, strategy, model, optimizer, losses, metrics, global_batch_size):
        if global_batch_size % strategy.num_replicas_in_sync:
            raise ValueError(
                f"`global_batch_size` must be divisible by the {strategy.num_replicas_in_sync} replicas. "
                f"Received: global_batch_size={global_batch_size}"
            )
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.global_batch_size = global_batch_size
        self.statistics = _Statistics(losses, metrics)
        self._train = tf.function(self._distributed(self._train_step), reduce_retracing=True)
        self._evaluate = tf.function(self._distributed(self._evaluate_step), reduce_retracing=True)

    def _distributed(self, step):
        def run(batch):
            sums = self.strategy.run(step, args=batch)
            return {name: self.strategy.reduce("SUM", value, axis=None) for name, value in sums.items()}

        return run

    def _train_step(self, inputs, targets):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)
            sums, per_example = self.statistics(targets, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch_size)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            scaled = self.optimizer.scale_loss(loss)  # mixed_float16's loss scale; the loss itself otherwise
        self.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        return sums

    def _evaluate_step(self, inputs, targets):
        return self.statistics(targets, self.model(inputs, training=False))[0]

    def distribute(self, dataset):
        return self.strategy.experimental_distribute_dataset(_sharded(dataset))

    def train_batch(self, batch):
        return self._train(batch)

    def evaluate(self, dataset, prefix=""):
        """Means over the whole `dataset` (each worker reads its shard; the sums are global)."""
        totals = {}
        with collectives():
            for batch in self.distribute(dataset):
                totals = _add(totals, self._evaluate(batch))
        return self.statistics.logs(totals, prefix)

    def check_same_step(self, step, restored):
        """Raises unless every worker restored the same optimizer step (a shared `output_dir`)."""
        workers = self.strategy.num_replicas_in_sync
        total = self._sum(tf.constant(float(step)))
        if float(total) != step * workers:
            raise ValueError(
                "the workers restored different checkpoints: every worker must see the chief's "
                f"`output_dir` (a shared file system). Received: step {step} from {restored!r} here, "
                f"{float(total) / workers:.1f} on average"
            )

    def barrier(self):
        """Returns once every worker got here (an all-reduce of nothing)."""
        self._sum(tf.constant(1.0))

    @tf.function
    def _sum(self, value):
        """`value` summed over every replica of every worker."""
        return self.strategy.reduce("SUM", self.strategy.run(lambda: tf.identity(value)), axis=None)


@dataclasses.dataclass(frozen=True)
class FitResult:
    history: list
    epochs_this_invocation: int
    trainer: DistributedTrainer


def fit_distributed(
    strategy,
    model,
    optimizer,
    losses,
    metrics,
    train_data,
    validation_data,
    *,
    epochs,
    global_batch_size,
    output_dir,
    monitor="val_loss",
    mode="min",
    patience=2,
    checkpoint_every=CHECKPOINT_EVERY,
    verbose=1,
):
    """Trains `model` (dict outputs) on `train_data(epoch)` batches of `global_batch_size` examples.

    Args:
        losses: `{output: keras loss}`, per example (see `per_example_losses`); `loss` is their sum.
        metrics: `{name: (output, fn(y_true, y_pred) -> per-example values)}`, e.g. `accuracy(output)`.
        train_data: `epoch -> dataset` of `(inputs, {output: target})` global batches, the same
            order on every worker and on every rerun (seed the shuffle with the epoch); each
            worker keeps its share of every batch.
        validation_data: a dataset like `train_data`'s, evaluated globally after every epoch.
        output_dir: the run's directory, the same on every worker: the chief writes there, the
            others into a temporary directory; everyone resumes from its checkpoints.
        checkpoint_every: steps between checkpoints (one is also written at every epoch's end).

    Returns:
        A `FitResult`: the epoch logs of the whole run (earlier invocations included, as in
        `history.csv`; on the chief only), the epochs this call trained, and the
        `DistributedTrainer` (for a global evaluation afterwards).
    """
    if checkpoint_every <= 0:
        raise ValueError(f"`checkpoint_every` must be positive. Received: checkpoint_every={checkpoint_every}")
    chief = is_chief(*cluster_task()[:2])
    output_dir = Path(output_dir)
    write_dir = worker_output_dir(output_dir)
    trainer = DistributedTrainer(strategy, model, optimizer, losses, metrics, global_batch_size)
    sign = 1.0 if mode == "min" else -1.0
    state = {
        "epoch": tf.Variable(0, dtype=tf.int64, trainable=False),
        "step_in_epoch": tf.Variable(0, dtype=tf.int64, trainable=False),
        "best": tf.Variable(float("inf"), dtype=tf.float64, trainable=False),  # sign * monitor
        "stale_epochs": tf.Variable(0, dtype=tf.int64, trainable=False),
    }
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, **state)
    manager = tf.train.CheckpointManager(checkpoint, str(write_dir / CHECKPOINTS), max_to_keep=2)
    latest = tf.train.latest_checkpoint(str(output_dir / CHECKPOINTS))
    if latest:
        checkpoint.restore(latest)
    with collectives():  # a lost worker: a clear error, never a hang
        trainer.check_same_step(_optimizer_step(optimizer), latest)
        history = [row for row in common.read_history(output_dir) if row["epoch"] < int(state["epoch"])] if chief else []
        writer = tf.summary.create_file_writer(str(write_dir / "tensorboard" / "train")) if chief else None

        def save():
            manager.save(checkpoint_number=_optimizer_step(optimizer))

        first_epoch = int(state["epoch"])
        while int(state["epoch"]) < epochs and int(state["stale_epochs"]) < patience:
            epoch, skip = int(state["epoch"]), int(state["step_in_epoch"])
            started = time.perf_counter()
            progress = keras.utils.Progbar(None, verbose=verbose if chief else 0, stateful_metrics=trainer.statistics.names)
            if chief and verbose:
                print(f"Epoch {epoch + 1}/{epochs}" + (f" (resumed after step {skip})" if skip else ""), flush=True)
            totals = {}
            for batch in trainer.distribute(train_data(epoch).skip(skip)):
                totals = _add(totals, trainer.train_batch(batch))
                state["step_in_epoch"].assign_add(1)
                progress.update(int(state["step_in_epoch"]), list(trainer.statistics.logs(totals).items()))
                if int(state["step_in_epoch"]) % checkpoint_every == 0:
                    save()
            progress.update(int(state["step_in_epoch"]), finalize=True)
            logs = {"epoch": float(epoch), **trainer.statistics.logs(totals)}
            logs.update(trainer.evaluate(validation_data, prefix="val_"))
            logs["epoch_seconds"] = time.perf_counter() - started
            if sign * logs[monitor] < float(state["best"]):
                state["best"].assign(sign * logs[monitor])
                state["stale_epochs"].assign(0)
                if chief:
                    model.save_weights(str(write_dir / common.BEST_WEIGHTS))
            else:
                state["stale_epochs"].assign_add(1)
            if chief:
                history.append(logs)
                _write_history(write_dir, history)
                with writer.as_default(step=epoch):
                    for name, value in logs.items():
                        tf.summary.scalar(name, value)
                writer.flush()
                if verbose:
                    print(" - ".join(f"{name}: {value:.4f}" for name, value in logs.items()), flush=True)
            state["epoch"].assign(epoch + 1)
            state["step_in_epoch"].assign(0)
            save()
        trainer.barrier()  # the chief's best weights are on disk before anyone reads them
    if not chief:
        shutil.rmtree(write_dir, ignore_errors=True)
    return FitResult(history, int(state["epoch"]) - first_epoch, trainer)


def _optimizer_step(optimizer):
    """The optimizer's step count (its variable is a `MirroredVariable` under the strategy)."""
    return int(tf.convert_to_tensor(optimizer.iterations.value))


def _write_history(output_dir, history):
    """Rewrites `history.csv` (atomically) with every epoch so far."""
    path = Path(output_dir) / common.HISTORY_CSV
    staging = path.with_suffix(".csv.tmp")
    with open(staging, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    os.replace(staging, path)
