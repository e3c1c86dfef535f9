"""The one training skeleton both trainers share (`pipelines.train_imdb`, `pipelines.train_translator`).

A trainer adds its own data and model flags, the shared ones (`add_training_arguments`) and one
flag per field of its model configuration (`add_config_arguments`, read back by `configured`),
then:

    policy, strategy = set_up(args)                # seed, dtype policy, distribution strategy
    with strategy.scope():
        model = build(config)
        model.compile(optimizer=adamw_with_warmup(...), ..., jit_compile=args.jit_compile)
    fitted = fit(args, strategy, policy, model, ...)   # the best epoch's weights restored
    summary = {**run_summary(args, policy, strategy, fitted), ...}

`fit` is the one fork between one machine (`model.fit` with the callbacks of
`pipelines.resumable_training`) and `--strategy multi_worker` (`pipelines.distributed`).
"""

import dataclasses
import os
from pathlib import Path

import keras
import tensorflow as tf

from appkit.cli import add_debug_flag
from appkit.cli import config_flag_type
from appkit.cli import fraction
from appkit.cli import non_negative_float
from appkit.cli import non_negative_int
from appkit.cli import positive_float
from appkit.cli import positive_int
from pipelines import distributed
from pipelines import resumable_training

PRECISION_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "mirrored")
SEED = 1337


def add_training_arguments(
    parser,
    *,
    output_dir,
    epochs,
    learning_rate,
    weight_decay,
    warmup_fraction,
    patience,
    jit_compile_help,
):
    """The flags every trainer takes (each trainer's defaults given here): `--output-dir`,
    `--mixed-precision` (float32 by default for every trainer), `--jit-compile`, `--strategy` with its multi-worker options, `--epochs`,
    the AdamW schedule (`--learning-rate`, `--weight-decay`, `--warmup-fraction`), `--patience`,
    `--seed`, `--op-determinism` and `--debug`."""
    parser.add_argument("--output-dir", default=output_dir, help="checkpoints, logs, vocabularies, summary")
    parser.add_argument(
        "--mixed-precision",
        choices=PRECISION_POLICIES,
        default="float32",
        help="dtype policy (default float32)",
    )
    parser.add_argument("--jit-compile", action="store_true", help=jit_compile_help)
    parser.add_argument(
        "--strategy",
        choices=(*STRATEGIES, distributed.MULTI_WORKER),
        default="default",
        help="multi_worker: MultiWorkerMirroredStrategy over the TF_CONFIG cluster (see pipelines.launch)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=distributed.CHECKPOINT_EVERY,
        help="multi_worker: training steps between checkpoints (also one per epoch)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=positive_int,
        default=distributed.TIMEOUT_SECONDS,
        help="multi_worker: seconds before a collective with a lost worker fails",
    )
    parser.add_argument("--epochs", type=positive_int, default=epochs)
    parser.add_argument("--learning-rate", type=positive_float, default=learning_rate)
    parser.add_argument("--weight-decay", type=non_negative_float, default=weight_decay)
    parser.add_argument("--warmup-fraction", type=fraction, default=warmup_fraction)
    parser.add_argument("--patience", type=non_negative_int, default=patience, help="EarlyStopping patience (epochs)")
    parser.add_argument("--seed", type=non_negative_int, default=SEED)
    parser.add_argument(
        "--op-determinism",
        action="store_true",
        help="run every TensorFlow op deterministically (tf.config.experimental.enable_op_determinism): "
        "an op with no deterministic kernel (on a GPU) then raises instead of varying",
    )
    add_debug_flag(parser)


def add_config_arguments(parser, defaults):
    """One flag per field of the model configuration dataclass `defaults` (`--num-heads` for
    `num_heads`), typed by `appkit.cli.config_flag_type`; a flag not given reads `None`."""
    for field in dataclasses.fields(defaults):
        default = getattr(defaults, field.name)
        shown = ",".join(default) if isinstance(default, tuple) else default
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=config_flag_type(field, default), help=f"default {shown}")


def configured(base, args):
    """The configuration `base` with the fields whose flags (`add_config_arguments`) were given."""
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(base)}
    return dataclasses.replace(base, **{name: value for name, value in given.items() if value is not None})


def set_up(args):
    """Seeds every generator with `--seed`, enables op determinism with `--op-determinism`, sets
    the dtype policy and makes the strategy.

    The seeds make a CPU run repeat on the same machine; its figures still depend on the CPU's
    kernels (oneDNN picks them by instruction set) and on how many threads TensorFlow splits an op
    over (one per core by default), neither of which `--op-determinism` changes.

    Returns:
        `(policy, strategy)`: the policy's name and a `tf.distribute.Strategy`.
    """
    keras.utils.set_random_seed(args.seed)
    if args.op_determinism:  # for the whole process: TensorFlow offers no public way back
        tf.config.experimental.enable_op_determinism()
    policy = set_precision(args.mixed_precision)
    if args.strategy == distributed.MULTI_WORKER:
        return policy, distributed.multi_worker_strategy(args.collective_timeout)
    return policy, make_strategy(args.strategy)


def set_precision(policy):
    """Sets the global Keras dtype policy (`None` = float32)."""
    policy = policy or "float32"
    if policy not in PRECISION_POLICIES:
        raise ValueError(f"`mixed_precision` must be one of {PRECISION_POLICIES}. Received: {policy!r}")
    keras.config.set_dtype_policy(policy)
    return policy


def make_strategy(name):
    """`"default"` (the current device) or `"mirrored"` (`MirroredStrategy` over all devices).

    For a mirrored run on CPU, configure several logical CPU devices first (before TensorFlow
    initialises), e.g. with `split_cpu(2)`; every GPU is used when there are GPUs.
    """
    if name not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {STRATEGIES}. Received: strategy={name!r}")
    if name == "default":
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    return tf.distribute.MirroredStrategy(devices=devices)


def split_cpu(count):
    """Splits the physical CPU into `count` logical devices; call before TensorFlow initialises."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def adamw_with_warmup(learning_rate, total_steps, warmup_fraction=0.1, weight_decay=0.01):
    """AdamW whose learning rate rises linearly for `warmup_fraction` of the steps, then cosine-decays."""
    warmup_steps = max(1, int(total_steps * warmup_fraction))
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(1, total_steps - warmup_steps),
        warmup_target=learning_rate,
        warmup_steps=warmup_steps,
    )
    return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=weight_decay)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What `fit` did.

    Attributes:
        history: the epoch logs of the whole run, earlier invocations included (`history.csv`);
            empty on a multi-worker run's other workers (the chief keeps it).
        epochs_this_invocation: the epochs this call trained.
        resumed_from_epoch: the epochs done when it started (`None`: a fresh run).
        best_epoch: 1-based number of the best epoch (its weights are the model's), `None` before any.
        distributed_trainer: a multi-worker run's `distributed.DistributedTrainer`, whose
            `evaluate` is global; `None` on one machine.
    """

    history: list
    epochs_this_invocation: int
    resumed_from_epoch: int | None
    best_epoch: int | None
    distributed_trainer: distributed.DistributedTrainer | None = None


def fit(
    args,
    strategy,
    policy,
    model,
    total_steps,
    train_batches,
    validation_batches,
    *,
    monitor,
    mode,
    losses,
    metrics,
    epoch_batches,
    counted=distributed.per_example,
):
    """Trains `model` for `args.epochs`, resuming the run found in `args.output_dir`, and loads the
    weights of its best epoch (`monitor`, better when `mode` is "min" lower, "max" higher).

    On one machine, `model` (compiled in `strategy`'s scope) is fitted on `train_batches` with
    `resumable_training.training_callbacks`. Under `--strategy multi_worker` `model.fit` fails
    (keras#20585), so `distributed.fit_distributed` trains it with the same AdamW schedule
    (loss-scaled under `mixed_float16`), the unreduced `losses`, the per-item `metrics` and
    `counted`, on `epoch_batches(epoch)`: each epoch's order seeded by the epoch, so that a rerun
    skips the very batches trained. Early stopping after `--patience` epochs either way.
    """
    output_dir = Path(args.output_dir)  # a multi-worker run's chief writes it, the others their own
    if args.strategy != distributed.MULTI_WORKER:
        callbacks = resumable_training.training_callbacks(
            output_dir, monitor=monitor, mode=mode, patience=args.patience
        )
        history = model.fit(  # shuffle=False: the dataset shuffles itself (Keras would warn each epoch)
            train_batches, validation_data=validation_batches, epochs=args.epochs, callbacks=callbacks, shuffle=False
        )
        resumable_training.restore_best_weights(model, output_dir)
        epochs = resumable_training.read_history(output_dir)
        this_invocation = len(history.epoch)
        return FitResult(
            epochs,
            this_invocation,
            resumable_training.resumed_from_epoch(len(epochs), this_invocation),
            best_epoch(epochs, monitor, mode),
        )
    with strategy.scope():
        optimizer = distributed.loss_scaled(
            adamw_with_warmup(args.learning_rate, total_steps, args.warmup_fraction, args.weight_decay), policy
        )
    fitted = distributed.fit_distributed(
        strategy,
        model,
        optimizer,
        distributed.unreduced(losses),
        metrics,
        epoch_batches,
        validation_batches,
        epochs=args.epochs,
        output_dir=output_dir,
        counted=counted,
        jit_compile=args.jit_compile,
        monitor=monitor,
        mode=mode,
        patience=args.patience,
        checkpoint_every=args.checkpoint_every,
    )
    resumable_training.restore_best_weights(model, output_dir)  # the chief's, on every worker
    return FitResult(
        fitted.history,
        fitted.epochs_this_invocation,
        fitted.first_epoch or None,
        best_epoch(fitted.history, monitor, mode),
        fitted.trainer,
    )


def best_epoch(history, monitor, mode):
    """1-based number of the epoch of `history` whose `monitor` is lowest (`mode="min"`) or
    highest (`"max"`), the first of equals: the epoch whose weights a run keeps. `None` if none."""
    rows = [row for row in history if monitor in row]
    if not rows:
        return None
    choose = min if mode == "min" else max
    return int(choose(rows, key=lambda row: row[monitor])["epoch"]) + 1


def run_summary(args, policy, strategy, fitted):
    """The figures every trainer's `summary.json` holds about how it trained."""
    return {
        "precision": policy,
        "jit_compile": args.jit_compile,
        "strategy": args.strategy,
        "replicas": strategy.num_replicas_in_sync,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "op_determinism": args.op_determinism,
        # TensorFlow splits each op over one thread per core by default: the figures reproduce with the same count.
        "cpu_cores": len(os.sched_getaffinity(0)),
        "epochs_run": len(fitted.history),
        "epochs_this_invocation": fitted.epochs_this_invocation,
        "resumed_from_epoch": fitted.resumed_from_epoch,
        "best_epoch": fitted.best_epoch,
    }
