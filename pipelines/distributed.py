"""Multi-worker training: the cluster from `TF_CONFIG`, a training step of our own, fault tolerance.

Why not `model.fit`: under `MultiWorkerMirroredStrategy` Keras 3's trainer fails
(keras-team/keras#20585, tensorflow#72388): its symbolic build calls `strategy.reduce("MEAN", ...)`
eagerly on a `PerReplica` value and `reduce_per_replica` reduces scalar metrics along axis 0 in
multi-worker mode. A step under `strategy.run` trains correctly when each replica divides the
*sum* of its losses by the *global* count of what the loss averages over (examples, or the real
target tokens of a token-budgeted batch: `counted`), all-reduced inside the step, and its
statistics are SUM-reduced; `fit_distributed` wraps it in what `fit` gives: a progress bar and
TensorBoard on the chief, the same losses and metrics, validation over the whole validation set,
the best weights, early stopping, a CSV history, and checkpoints every N steps and every epoch.

    strategy = multi_worker_strategy()            # reads TF_CONFIG
    with strategy.scope():
        model = build(...)                        # outputs: a dict of named tensors, or one tensor
        optimizer = keras.optimizers.AdamW(...)   # built inside the scope (loss_scaled() for float16)
    history = fit_distributed(strategy, model, optimizer, losses, metrics, train_data, validation,
                              epochs=2, output_dir=output_dir)

`jit_compile=True` XLA-compiles each replica's forward and backward pass; the all-reduces and the
optimizer update stay outside XLA (TensorFlow 2.21 has no XLA collectives on CPU: "Collectives
are not yet implemented for CPU devices when compiling with XLA"). Under `mixed_float16` the
optimizer is a `keras.optimizers.LossScaleOptimizer`: the loss is scaled, the gradients unscaled,
and a step whose gradients are not finite on *any* worker is skipped by *every* worker (each
`LossScaleOptimizer` only looks at its own replica's gradients, before the all-reduce: alone, one
worker would skip while the others wait in the all-reduce).

Every worker runs the same command. Only the chief (task `chief`, or `worker` 0 without one)
writes under `output_dir`; the others write their checkpoints to a temporary directory of their
own, as TensorFlow's guide requires (saving is a collective: every worker saves). A rerun
restores the chief's latest checkpoint (on a real cluster `output_dir` must be on a file system
every worker reads), skips the steps of the interrupted epoch already trained, and goes on: the
optimizer's step counter continues. A lost worker makes the others' collectives fail within
`timeout_seconds`: they raise `WorkerLostError`, and a worker's main wrapped in
`exit_when_a_worker_is_lost()` then exits with an error, never hangs.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import keras
import tensorflow as tf

from pipelines import resumable_training

MULTI_WORKER = "multi_worker"
TIMEOUT_SECONDS = 60
CHECKPOINT_EVERY = 100
CHECKPOINTS = "checkpoints"


class WorkerLostError(RuntimeError):
    """A collective did not complete: another worker died or stopped answering."""


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


@contextlib.contextmanager
def worker_directory(output_dir):
    """`worker_output_dir(output_dir)`; a temporary one (not the chief's) is removed on exit."""
    directory = worker_output_dir(output_dir)
    try:
        yield directory
    finally:
        if directory != Path(output_dir):
            shutil.rmtree(directory, ignore_errors=True)


def unreduced(losses):
    """`losses` (one Keras loss, or `{output: loss}`) returning one value per example or token (no reduction)."""
    for loss in _named(losses).values():
        loss.reduction = None
    return losses


def accuracy(output):
    """A metric entry for `fit_distributed`: the binary accuracy of `output`, one value per example."""
    return output, keras.metrics.binary_accuracy


def token_accuracy():
    """A metric entry for `fit_distributed`: the arg-max accuracy of the model's one output, per token
    (averaged over the real tokens with `counted=real_tokens(...)`, as `models.translator.TokenAccuracy`)."""
    return None, keras.metrics.sparse_categorical_accuracy


def per_example(targets):
    """`counted` for a loss averaged over examples: weight 1 for every example of the batch."""
    return tf.ones(tf.shape(next(iter(targets.values())))[:1], tf.float32)  # (batch,)


def real_tokens(padding_id):
    """`counted` for a loss averaged over target tokens: weight 1 for each token that is not `padding_id`."""

    def counted(targets):
        return tf.cast(tf.not_equal(targets[None], padding_id), tf.float32)  # (batch, target_len)

    return counted


def _named(value):
    """`value` as `{name: value}`: a dict as it is, one unnamed value as `{None: value}`."""
    return value if isinstance(value, dict) else {None: value}


class _Statistics:
    """Per-replica weighted sums of the losses and metrics of one batch; `logs` turns global sums into means.

    `counted(targets)` weighs every item (example or token) the losses and metrics average over:
    the sums are `sum(weight * value)` and `count` is `sum(weight)`.
    """

    def __init__(self, losses, metrics, counted=per_example):
        self.losses, self.metrics, self.counted = _named(losses), metrics, counted
        self.names = [f"{name}_loss" for name in self.losses if name is not None] + ["loss", *metrics]

    def count(self, targets):
        return tf.reduce_sum(self.counted(_named(targets)))

    def __call__(self, targets, outputs):
        targets, outputs = _named(targets), _named(outputs)
        weights = self.counted(targets)  # (batch,) or (batch, target_len)
        sums = {"count": tf.reduce_sum(weights)}
        total = 0.0
        for name, loss in self.losses.items():
            per_item = _per_item(loss(targets[name], outputs[name]), weights) * weights
            if name is not None:
                sums[f"{name}_loss"] = tf.reduce_sum(per_item)
            total += tf.reduce_sum(per_item)
        sums["loss"] = total
        for name, (output, metric) in self.metrics.items():
            sums[name] = tf.reduce_sum(_per_item(metric(targets[output], outputs[output]), weights) * weights)
        return sums, total

    def logs(self, sums, prefix=""):
        count = max(float(sums["count"]), 1.0)
        return {prefix + name: float(value) / count for name, value in sums.items() if name != "count"}


def _per_item(values, weights):
    """`values` (one per example or token, e.g. `(batch, 1)` from `binary_accuracy`) in float32, shaped as `weights`."""
    return tf.reshape(tf.cast(values, tf.float32), tf.shape(weights))


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
    except (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.InternalError,
        tf.errors.AbortedError,
    ) as error:
        raise WorkerLostError(
            "a collective with the other workers failed or timed out: a worker died or stopped answering. "
            "Rerun the same command on every worker to resume from the last checkpoint. "
            f"Received: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error


@contextlib.contextmanager
def exit_when_a_worker_is_lost(status=1):
    """Ends the process with `status` and the error's traceback when a `WorkerLostError` leaves
    the block, without the interpreter's shutdown: wrap a worker's whole main in it.

    A process whose collectives were aborted cannot train again (TensorFlow: "Restart your program
    to reset"), and its shutdown can hang: the aborted run's tf.data iterator is freed by the
    final garbage collection, after Python stopped letting threads take the GIL, and its teardown
    waits for a batch still in a `tf.py_function` that never returns (a gdb backtrace of the
    survivor of a killed worker: `MultiDeviceBuffer::Reset` under `Py_FinalizeEx`, in 3 of 25 runs).
    """
    try:
        yield
    except WorkerLostError:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def loss_scaled(optimizer, policy):
    """`optimizer` in a `keras.optimizers.LossScaleOptimizer` under `mixed_float16` (as `compile`
    does); as it is otherwise. Call it inside the strategy's scope."""
    return keras.optimizers.LossScaleOptimizer(optimizer) if policy == "mixed_float16" else optimizer


def finite_everywhere(gradients):
    """In a replica context: whether every gradient of every replica is finite (one all-reduce)."""
    local = tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients if g is not None])
    not_finite = tf.distribute.get_replica_context().all_reduce("SUM", 1.0 - tf.cast(local, tf.float32))
    return tf.equal(not_finite, 0.0)


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _poisoned(gradients, finite):
    """`gradients` as they are when `finite`, else NaN: every `LossScaleOptimizer` then skips the step."""
    poison = tf.where(finite, 0.0, float("nan"))

    def add(gradient):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(
                gradient.values + tf.cast(poison, gradient.dtype), gradient.indices, gradient.dense_shape
            )
        return gradient + tf.cast(poison, gradient.dtype)

    return [None if g is None else add(g) for g in gradients]


class DistributedTrainer:
    """The replica step (`strategy.run`; the loss sum over the global count, all-reduced in the
    step; SUM-reduced sums) and a global evaluation; `fit_distributed` drives it.

    Args:
        losses, metrics, counted: as `fit_distributed`'s.
        jit_compile: XLA-compile each replica's forward and backward pass (the all-reduces and the
            optimizer update run outside XLA).
    """

    def __init__(self, strategy, model, optimizer, losses, metrics, counted=per_example, jit_compile=False):
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.statistics = _Statistics(losses, metrics, counted)
        self.loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self._gradients = (
            tf.function(self._replica_gradients, jit_compile=True) if jit_compile else self._replica_gradients
        )
        self._functions = {}

    def _function(self, step, spec):
        """`step` on every replica with its sums SUM-reduced, a `tf.function` traced once per batch
        spec (the bucketed batches' sizes and lengths are unknown dimensions: one trace, not one per shape)."""
        key = (step, tuple(tf.nest.flatten(spec)))  # the spec holds dicts: not hashable itself
        if key not in self._functions:

            def run(batch):
                sums = self.strategy.run(step, args=batch)
                return {name: self.strategy.reduce("SUM", value, axis=None) for name, value in sums.items()}

            self._functions[key] = tf.function(run, input_signature=[spec])
        return self._functions[key]

    def _train_step(self, inputs, targets):
        # The global number of examples (or real tokens) of this step: every replica's loss sum
        # is divided by it, so that the all-reduced (summed) gradients are those of the global mean.
        count = tf.distribute.get_replica_context().all_reduce("SUM", self.statistics.count(targets))
        sums, gradients = self._gradients(inputs, targets, count)
        if self.loss_scaled:
            gradients = _poisoned(gradients, finite_everywhere(gradients))
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))  # all-reduces (SUM)
        return sums

    def _replica_gradients(self, inputs, targets, count):
        """This replica's statistics and the gradients of its share of the global mean loss (scaled under float16)."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)
            sums, loss_sum = self.statistics(targets, outputs)
            loss = tf.math.divide_no_nan(loss_sum, count)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            scaled = self.optimizer.scale_loss(loss)  # mixed_float16's loss scale; the loss itself otherwise
        return sums, tape.gradient(scaled, variables)

    def _evaluate_step(self, inputs, targets):
        return self.statistics(targets, self.model(inputs, training=False))[0]

    def distribute(self, dataset):
        return self.strategy.experimental_distribute_dataset(_sharded(dataset))

    def train(self, dataset):
        """Trains on every global batch of `dataset`, yielding each step's global sums."""
        batches = self.distribute(dataset)
        step = self._function(self._train_step, batches.element_spec)
        for batch in batches:
            yield step(batch)

    def evaluate(self, dataset, prefix=""):
        """Means over the whole `dataset` (each worker reads its shard; the sums are global)."""
        totals = {}
        with collectives():
            batches = self.distribute(dataset)
            step = self._function(self._evaluate_step, batches.element_spec)
            for batch in batches:
                totals = _add(totals, step(batch))
        return self.statistics.logs(totals, prefix)

    def check_same_step(self, step, restored):
        """Raises unless every worker restored the same optimizer step (a shared `output_dir`)."""
        if not same_on_every_worker(self.strategy, step):
            raise ValueError(
                "the workers restored different checkpoints: every worker must see the chief's "
                f"`output_dir` (a shared file system). Received: step {step} from {restored!r} here"
            )

    def barrier(self):
        """Returns once every worker got here (an all-reduce of nothing)."""
        _sum(self.strategy, tf.constant(0, tf.int64))


def same_on_every_worker(strategy, value):
    """Whether every worker passed the same integer `value` in [0, 2**30) (a collective: every worker calls it).

    The sum and the sum of squares over the replicas prove it: with `n` replicas, `sum(x) == n * v`
    and `sum(x ** 2) == n * v ** 2` leave `sum((x - v) ** 2) == 0`.
    """
    if not 0 <= value < 2**30:
        raise ValueError(f"`value` must be an integer in [0, 2**30). Received: value={value}")
    replicas, value = strategy.num_replicas_in_sync, int(value)
    total, squares = (int(x) for x in _sum(strategy, tf.constant([value, value * value], tf.int64)))
    return total == replicas * value and squares == replicas * value * value


@tf.function
def _sum(strategy, value):
    """`value` summed over every replica of every worker."""
    return strategy.reduce("SUM", strategy.run(lambda: tf.identity(value)), axis=None)


@dataclasses.dataclass(frozen=True)
class FitResult:
    history: list
    first_epoch: int  # epochs done when this call started (0: a fresh run)
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
    output_dir,
    counted=per_example,
    jit_compile=False,
    monitor="val_loss",
    mode="min",
    patience=2,
    checkpoint_every=CHECKPOINT_EVERY,
    verbose=1,
):
    """Trains `model` on the global batches of `train_data(epoch)`.

    Args:
        losses: `{output: keras loss}` for a model with named (dict) outputs, or one loss for a
            model with one output; unreduced (see `unreduced`); `loss` is their sum.
        metrics: `{name: (output, fn(y_true, y_pred) -> per-item values)}`, e.g. `accuracy(output)`
            (`output` None for a model with one output, e.g. `token_accuracy()`).
        train_data: `epoch -> dataset` of `(inputs, targets)` global batches (`targets` a dict
            `{output: target}` or one tensor, as the model's outputs), the same order on every
            worker and on every rerun (seed the shuffle with the epoch); each worker keeps its
            share of every batch (any size: a worker's share may be empty).
        validation_data: a dataset like `train_data`'s, evaluated globally after every epoch.
        output_dir: the run's directory, the same on every worker: the chief writes there, the
            others into a temporary directory; everyone resumes from its checkpoints.
        checkpoint_every: steps between checkpoints (one is also written at every epoch's end).
        counted: `targets -> weights` of what the losses and metrics average over: `per_example`,
            or `real_tokens(padding_id)` for token-budgeted sequence batches. Each step's loss is
            the sum over every worker's items divided by their global count.
        jit_compile: XLA-compile each replica's forward and backward pass.

    Returns:
        A `FitResult`: the epoch logs of the whole run (earlier invocations included, as in
        `history.csv`; on the chief only), the epochs this call trained, and the
        `DistributedTrainer` (for a global evaluation afterwards).
    """
    if checkpoint_every <= 0:
        raise ValueError(f"`checkpoint_every` must be positive. Received: checkpoint_every={checkpoint_every}")
    chief = is_chief(*cluster_task()[:2])
    output_dir = Path(output_dir)
    with worker_directory(output_dir) as write_dir:
        trainer = DistributedTrainer(strategy, model, optimizer, losses, metrics, counted, jit_compile)
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
            history = (
                [row for row in resumable_training.read_history(output_dir) if row["epoch"] < int(state["epoch"])]
                if chief
                else []
            )
            writer = tf.summary.create_file_writer(str(write_dir / "tensorboard" / "train")) if chief else None

            def save():
                manager.save(checkpoint_number=_optimizer_step(optimizer))

            first_epoch = int(state["epoch"])
            while int(state["epoch"]) < epochs and int(state["stale_epochs"]) < patience:
                epoch, skip = int(state["epoch"]), int(state["step_in_epoch"])
                started = time.perf_counter()
                progress = keras.utils.Progbar(
                    None, verbose=verbose if chief else 0, stateful_metrics=trainer.statistics.names
                )
                if chief and verbose:
                    print(f"Epoch {epoch + 1}/{epochs}" + (f" (resumed after step {skip})" if skip else ""), flush=True)
                totals = {}
                for sums in trainer.train(train_data(epoch).skip(skip)):
                    totals = _add(totals, sums)
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
                        model.save_weights(str(write_dir / resumable_training.BEST_WEIGHTS))
                else:
                    state["stale_epochs"].assign_add(1)
                if chief:
                    history.append(logs)
                    resumable_training.write_history(write_dir / resumable_training.HISTORY_CSV, history)
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
        return FitResult(history, first_epoch, int(state["epoch"]) - first_epoch, trainer)


def _optimizer_step(optimizer):
    """The optimizer's step count (its variable is a `MirroredVariable` under the strategy)."""
    return int(tf.convert_to_tensor(optimizer.iterations.value))
