"""Training helpers shared by the pipelines: precision, strategy, callbacks, schedules, summaries.

Nothing here is specific to one data set. Typical use in a training CLI:

    set_precision(args.mixed_precision)
    strategy = make_strategy(args.strategy)
    with strategy.scope():
        model = build(...)
        model.compile(optimizer=adamw_with_warmup(lr, total_steps), ..., jit_compile=args.jit_compile)
    model.fit(..., callbacks=training_callbacks(output_dir, monitor="val_accuracy"))
    restore_best_weights(model, output_dir)
    write_json_atomic(output_dir / "summary.json", summary)  # models.files
"""

import csv
import math
import time
from pathlib import Path

import keras
import tensorflow as tf

PRECISION_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "mirrored")
BEST_WEIGHTS = "best.weights.h5"
HISTORY_CSV = "history.csv"


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


def read_history(output_dir):
    """Epoch logs written so far by `CSVLogger` (a resumed run sees the earlier epochs)."""
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
    """BackupAndRestore, TensorBoard, best-weights checkpoint, EarlyStopping, CSV history.

    Rerunning the same command after a crash resumes from the last finished epoch
    (`BackupAndRestore` under `<output_dir>/backup`, kept after the run, so rerunning a finished
    run trains nothing more); the best checkpoint only gets overwritten by a better `monitor`
    value than any epoch in the CSV history, resumed runs included. The history also records
    each epoch's duration (`epoch_seconds`), so time and throughput add up across resumes. The
    progress bar is `fit(verbose=1)`'s own.
    """
    output_dir = Path(output_dir)
    earlier = [row[monitor] for row in read_history(output_dir) if monitor in row]
    best_so_far = (max(earlier) if mode == "max" else min(earlier)) if earlier else None
    return [
        keras.callbacks.BackupAndRestore(str(output_dir / "backup"), delete_checkpoint=False),
        EpochTimer(),
        keras.callbacks.TensorBoard(log_dir=str(output_dir / "tensorboard")),
        keras.callbacks.ModelCheckpoint(
            str(output_dir / BEST_WEIGHTS),
            monitor=monitor,
            mode=mode,
            save_best_only=True,
            save_weights_only=True,
            initial_value_threshold=best_so_far,
        ),
        keras.callbacks.EarlyStopping(monitor=monitor, mode=mode, patience=patience),
        keras.callbacks.CSVLogger(str(output_dir / HISTORY_CSV), append=True),
    ]


def restore_best_weights(model, output_dir):
    """Loads the best checkpoint written by `training_callbacks`, if there is one."""
    path = Path(output_dir) / BEST_WEIGHTS
    if path.is_file():
        model.load_weights(str(path))
    return path


def steps_per_epoch(examples, batch_size):
    return max(1, math.ceil(examples / batch_size))


def bucket_boundaries(sequence_length, width):
    """`bucket_by_sequence_length` boundaries padding batches to multiples of `width`, at most `sequence_length`.

    A length `n` goes to the first bucket whose boundary exceeds it, so the boundaries are the
    padded lengths `width, 2 * width, ..., sequence_length` plus one.
    """
    lengths = list(range(width, sequence_length, width)) + [sequence_length]
    return [length + 1 for length in lengths]
