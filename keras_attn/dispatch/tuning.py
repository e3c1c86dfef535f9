"""Calibrating the cost model (`keras_attn.dispatch.cost_model`) on this machine: `tune()`.

A grid of attention calls (`grid`: lengths, batch sizes, and the settings causal, bidirectional,
packed, windowed, strided, each as a forward call and a training call with and without dropout) is
measured on every kernel that takes each call (`measure`: best wall time of a compiled step,
forward and backward in training; the first run's peak in TensorFlow's allocator where it keeps
statistics),
and the coefficients of each kernel and mode are fitted by non-negative least squares on relative
error (`fit`): times spread over orders of magnitude, and what the dispatcher compares is ratios.
`benchmarks/dispatch_grid.py` runs the full grid and writes the calibration the package ships;
`tune()` refits the time coefficients on a small grid and stores them in the user's cache
directory, where the dispatcher reads them first (the bytes a kernel holds do not depend on the
machine's speed: the memory coefficients stay the shipped ones unless `measure_memory=True`).
"""

import dataclasses
import functools
import math
import os
import time

import keras
import numpy as np

from keras_attn import patterns
from keras_attn.dispatch import cost_model
from keras_attn.dispatch import measuring
from keras_attn.dispatch import state
from keras_attn.kernels import KERNELS
from keras_attn.kernels import cost
from keras_attn.kernels.call import AttentionCall

SETTINGS = ("causal", "bidirectional", "packed", "windowed", "strided")
WINDOW = 256  # keys each query of a windowed call sees (Mistral-style local attention)
STRIDE = 64  # the strided setting's band and stride: Causal() & (SlidingWindow(64) | Strided(64))
MEMORY_FLOOR_BYTES = 2**20  # peaks below a megabyte are the allocator's rounding: not fitted
# The grid `tune()` takes: five time coefficients per kernel and mode are fitted from the cells'
# lengths, so they need three distinct ones at least (one length fits a line through one point,
# and predicts minutes for a millisecond call elsewhere); a cell's dense logits stay under a GiB.
MIN_DISTINCT_LENGTHS = 3
LENGTH_RANGE = (16, 16384)
MAX_CELL_PAIRS = 2**28  # batch * heads * length**2 of the grid's largest cell
# A fit is written only if it predicts the measurements it was fitted to: per kernel and mode, the
# median ratio of predicted to measured time within this factor either way.
FIT_TOLERANCE = 3.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One call of the grid: `batch` rows of `length` tokens, `heads` x `depth`, a `setting` of
    `SETTINGS`, in `mode` (`"forward"` or `"training"`), with attention dropout or not."""

    batch: int
    length: int
    heads: int
    depth: int
    setting: str
    mode: str
    dropout: bool

    def pattern(self):
        if self.setting == "causal":
            return patterns.Causal()
        if self.setting == "windowed":
            return patterns.Causal() & patterns.SlidingWindow(WINDOW)
        if self.setting == "strided":
            return patterns.Causal() & (patterns.SlidingWindow(STRIDE) | patterns.Strided(STRIDE))
        return None

    def segment_ids(self):
        return measuring.packed_ids(self.batch, self.length) if self.setting == "packed" else None

    def call(self, query=None, key=None, value=None):
        """The `AttentionCall` of this cell (symbolic tensors unless given)."""
        shape = (self.batch, self.length, self.heads, self.depth)
        query = keras.KerasTensor(shape) if query is None else query
        ids = self.segment_ids()
        ids = None if ids is None else keras.KerasTensor(ids.shape, "int32")
        return AttentionCall(
            query=query,
            key=query if key is None else key,
            value=query if value is None else value,
            pattern=self.pattern(),
            scale=self.depth**-0.5,
            dropout_rate=0.1 if self.dropout else 0.0,
            query_segment_ids=ids,
            key_segment_ids=ids,
            training=self.mode == "training",
        )


def grid(lengths, batch_sizes, heads=8, depth=64, settings=SETTINGS):
    """Every `Cell` of the grid: each length, batch size and setting as a forward call, a training
    call and a training call with dropout."""
    return [
        Cell(batch, length, heads, depth, setting, mode, dropout)
        for length in lengths
        for batch in batch_sizes
        for setting in settings
        for mode, dropout in (("forward", False), ("training", False), ("training", True))
    ]


def candidates(cell):
    """The kernels of the registry that take the cell's call."""
    call = cell.call()
    return [name for name, module in KERNELS.items() if not module.why_unsupported(call)]


def _step(cell, implementation):
    """A compiled step of the cell on `implementation` (a kernel, or `KERAS_DENSE`: Keras's layer's own attention)."""
    import tensorflow as tf

    from keras_attn.core.segments import segment_mask
    from keras_attn.dispatch.attention import scaled_dot_product_attention

    shape = (cell.batch, cell.length, cell.heads, cell.depth)
    query, key, value = (tf.random.normal(shape, seed=seed) for seed in (1, 2, 3))
    # The step's arguments, as a model is fed its inputs and document ids: ids made inside the
    # traced step would be constants the graph optimiser folds the chunked kernel's document
    # skipping into; tensors it captured would stay in memory with the graph, which TensorFlow
    # keeps alive once it holds a custom gradient.
    ids = cell.segment_ids()
    ids = None if ids is None else tf.constant(ids)
    pattern = cell.pattern()
    seed_generator = keras.random.SeedGenerator(0)
    if implementation == cost_model.KERAS_DENSE:
        layer = keras.layers.MultiHeadAttention(cell.heads, cell.depth, dropout=0.1 if cell.dropout else 0.0)
        layer(tf.zeros((1, 2, cell.heads * cell.depth)), tf.zeros((1, 2, cell.heads * cell.depth)))

        def attend(q, k, v, ids):
            # What the layer's `call` hands its attention: the causal flag alone, else a (batch, q, k) mask.
            mask = None
            if cell.setting in ("windowed", "strided"):
                mask = pattern.block_mask(cell.length, cell.length, 0, 0)[:, 0]
            elif ids is not None:
                mask = segment_mask(ids, ids)[:, 0]
            mask = None if mask is None else tf.broadcast_to(mask, (cell.batch, cell.length, cell.length))
            return layer._compute_attention(
                q, k, v, attention_mask=mask, training=cell.mode == "training", use_causal_mask=cell.setting == "causal"
            )[0]

    else:

        def attend(q, k, v, ids):
            return scaled_dot_product_attention(
                q,
                k,
                v,
                pattern=pattern,
                dropout_rate=0.1 if cell.dropout else 0.0,
                training=cell.mode == "training",
                seed_generator=seed_generator,
                segment_ids=ids,
                implementation=implementation,
            )

    @tf.function(autograph=False)  # plain TensorFlow: no AutoGraph conversion to go wrong
    def forward(q, k, v, ids):
        return attend(q, k, v, ids)

    @tf.function(autograph=False)  # plain TensorFlow: no AutoGraph conversion to go wrong
    def training(q, k, v, ids):
        with tf.GradientTape() as tape:
            tape.watch((q, k, v))
            loss = tf.reduce_sum(tf.cast(attend(q, k, v, ids), "float32") ** 2)
        return tape.gradient(loss, (q, k, v))

    step = training if cell.mode == "training" else forward
    traced = step.get_concrete_function(query, key, value, ids)  # traced outside the measurement
    return functools.partial(traced, query, key, value, ids)


def _peak_bytes(step):
    """The first run's peak of TensorFlow's CPU allocator over what it held before, or `None` when
    the allocator keeps no statistics (it does once `TF_CPU_ALLOCATOR_USE_BFC=true` was set before
    TensorFlow started). The process's resident memory would not do: the allocator keeps what a
    step freed, so a later step's peak would not show in it."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except (ValueError, tf.errors.OpError):
        measuring.run_to_completion(step())
        return None
    measuring.run_to_completion(step())
    return max(0, tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)


def measure(cell, names, repeats=2):
    """`{name: {"seconds", "peak_bytes"}}` of the cell on each implementation of `names`: a first
    run each (whose peak memory is measured), then timed in turn as `auto` times them
    (`keras_attn.dispatch.measuring.best_seconds`, `repeats` rounds at least, no budget)."""
    steps = {name: _step(cell, name) for name in names}
    peaks = {name: _peak_bytes(step) for name, step in steps.items()}
    seconds = measuring.best_seconds(steps, repeats, budget_seconds=math.inf)
    return {name: {"seconds": seconds[name], "peak_bytes": peaks[name]} for name in names}


def _nonnegative_least_squares(features, targets):
    """`x >= 0` minimising `|features @ x - targets|`: least squares, dropping the most negative
    coefficient's column until none is negative (enough for a handful of features)."""
    active = list(range(features.shape[1]))
    while active:
        solution, *_ = np.linalg.lstsq(features[:, active], targets, rcond=None)
        if solution.min() >= 0:
            result = np.zeros(features.shape[1])
            result[active] = solution
            return result
        del active[int(np.argmin(solution))]
    return np.zeros(features.shape[1])


def fit(rows, part):
    """Coefficients `{name: {mode: {feature: value}}}` of `part` (`"time"` or `"memory"`) fitted to
    measured `rows` (`{"cell": Cell, "name", "seconds", "peak_bytes"}`), on relative error."""
    target_key, feature_names = (
        ("seconds", cost.TIME_FEATURES) if part == "time" else ("peak_bytes", cost.MEMORY_FEATURES)
    )
    groups = {}
    for row in rows:
        if part == "time" and row["name"] not in KERNELS:  # Keras's layer: a peer measured, never predicted
            continue
        target = row[target_key]
        if target is None or not np.isfinite(target):
            continue
        features = cost_model.kernel_features(row["name"], row["cell"].call())
        values = features.time if part == "time" else features.memory
        if part == "memory" and values["pairwise_bytes"] + values["linear_bytes"] < MEMORY_FLOOR_BYTES:
            continue
        name = cost_model.memory_model(row["name"], features) if part == "memory" else row["name"]
        groups.setdefault((name, row["cell"].mode), []).append(([values[f] for f in feature_names], target))
    coefficients = {}
    for (name, mode), samples in sorted(groups.items()):
        matrix = np.array([x for x, _ in samples], dtype="float64")
        targets = np.array([y for _, y in samples], dtype="float64")
        weights = 1.0 / np.maximum(targets, np.finfo("float64").tiny)  # relative error
        solution = _nonnegative_least_squares(matrix * weights[:, None], targets * weights)
        coefficients.setdefault(name, {})[mode] = {f: float(v) for f, v in zip(feature_names, solution)}
    return coefficients


def calibrate(cells, repeats=2, measure_memory=True, log=print):
    """Measures every cell on the kernels that take it (and Keras's layer) and fits the coefficients.

    Returns `(calibration, rows)`: the calibration dict (`"time"`, `"memory"`, `"grid"`) and the
    measured rows. Memory is fitted only when `measure_memory`.
    """
    rows = []
    for cell in cells:
        names = [*candidates(cell), cost_model.KERAS_DENSE] if measure_memory else candidates(cell)
        for name, measured in measure(cell, names, repeats).items():
            rows.append({"cell": cell, "name": name, **measured})
        if log:
            log(f"{cell}: " + ", ".join(f"{r['name']} {r['seconds'] * 1e3:.1f} ms" for r in rows[-len(names) :]))
    calibration = {"time": fit(rows, "time"), "memory": fit(rows, "memory") if measure_memory else {}}
    return calibration, rows


def write_calibration(calibration, path, grid_description):
    """Writes `calibration` (plus the grid and the machine it was measured on) as JSON to `path`,
    atomically under a lock (`keras_attn.dispatch.state.update`), tagged with this environment."""
    import platform

    payload = {
        "grid": grid_description,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        },
        **calibration,
    }
    return os.fspath(state.update(path, cost_model.calibration_problem, lambda current: payload))


def tune(
    lengths=(256, 512, 1024),
    batch_sizes=(1,),
    heads=8,
    depth=64,
    repeats=2,
    settings=SETTINGS,
    measure_memory=False,
    verbose=False,
):
    """Refits the dispatcher's cost model on this machine and stores it in the user's cache directory.

    Measures each kernel on a grid of calls (every length and batch size, causal, bidirectional,
    packed, windowed and strided, forward and training with and without dropout), fits the time
    coefficients (and the memory ones when `measure_memory`, from the peaks of TensorFlow's CPU
    allocator: set `TF_CPU_ALLOCATOR_USE_BFC=true` before TensorFlow starts), and writes them to `keras_attn.dispatch.cost_model.user_calibration_path()`
    (`$KERAS_ATTN_CACHE/calibration.json`, else `~/.cache/keras_attn/calibration.json`), never into
    the package. `implementation="auto"` reads it from then on (in this process too), the shipped
    calibration filling what it lacks. Several minutes with the defaults (45 calls, each on every kernel
    taking it: tracing dominates at these lengths); the figures are as noisy as
    the machine's load.

    Args:
        lengths: sequence lengths of the grid: at least `MIN_DISTINCT_LENGTHS` (3) distinct ints
            within `LENGTH_RANGE` (16 to 16,384).
        batch_sizes: batch sizes of the grid (positive ints); the largest call,
            `max(batch_sizes) * heads * max(lengths)**2` logits, at most `MAX_CELL_PAIRS` (2**28).
        heads: attention heads of the grid's calls (positive int).
        depth: per-head depth of the grid's calls (positive int).
        repeats: timed runs of each step, the best kept (positive int).
        settings: the kinds of call of the grid, a non-empty subset of `SETTINGS` (a kernel that
            takes none of them keeps its shipped coefficients: the strided one needs `"strided"`).
        measure_memory: also refit the memory coefficients (bool); a `ValueError` when
            TensorFlow's allocator keeps no statistics.
        verbose: print each measured cell (bool).

    The cache directory is checked for writing first, before anything is measured; the file is
    written atomically (`keras_attn.dispatch.state`), and only when the fit predicts its own
    measurements (`check_fit`).

    Returns:
        The path of the calibration written.

    Example:

    Where it writes (the dispatcher reads this file first, the shipped calibration after it):

    >>> from keras_attn.dispatch.cost_model import user_calibration_path
    >>> user_calibration_path().name
    'calibration.json'
    """
    for name, values in (("lengths", lengths), ("batch_sizes", batch_sizes)):
        if (
            isinstance(values, (str, bytes))
            or not hasattr(values, "__iter__")
            or not values
            or not all(_positive_int(v) for v in values)
        ):
            raise ValueError(f"`{name}` must be a non-empty sequence of positive ints. Received: {name}={values!r}")
    if isinstance(settings, str) or not settings or not set(settings) <= set(SETTINGS):
        raise ValueError(f"`settings` must be a non-empty sequence of {SETTINGS}. Received: settings={settings!r}")
    for name, value in (("heads", heads), ("depth", depth), ("repeats", repeats)):
        if not _positive_int(value):
            raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    for name, value in (("measure_memory", measure_memory), ("verbose", verbose)):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")
    _check_grid_sizes(lengths, batch_sizes, heads)
    path = cost_model.user_calibration_path()
    unwritable = state.unwritable_reason(path.parent)  # before minutes of measuring, not after
    if unwritable:
        raise ValueError(
            f"`tune()` writes to the cache directory {path.parent}, where no file can be written ({unwritable}). "
            f"Set ${state.CACHE_ENV} to a writable directory. Received: {state.CACHE_ENV}={str(path.parent)!r}"
        )
    if measure_memory and not _allocator_keeps_statistics():
        raise ValueError(
            "`measure_memory=True` needs the peaks of TensorFlow's CPU allocator: set "
            "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts. Received: measure_memory=True"
        )
    cells = grid(tuple(lengths), tuple(batch_sizes), heads, depth, tuple(settings))
    calibration, rows = calibrate(cells, repeats, measure_memory, log=print if verbose else None)
    check_fit(calibration, rows)
    description = {
        "lengths": list(lengths),
        "batch_sizes": list(batch_sizes),
        "heads": heads,
        "depth": depth,
        "settings": list(settings),
    }
    path = write_calibration(calibration, path, description)
    cost_model.reload_calibration()
    return path


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_grid_sizes(lengths, batch_sizes, heads):
    """Refuses a grid that cannot be fitted (too few distinct lengths) or that would not fit in memory."""
    low, high = LENGTH_RANGE
    if len(set(lengths)) < MIN_DISTINCT_LENGTHS or not all(low <= length <= high for length in lengths):
        raise ValueError(
            f"`lengths` must hold at least {MIN_DISTINCT_LENGTHS} distinct lengths between {low} and {high} "
            f"(the fit needs them to tell per-call, per-step and per-pair costs apart). Received: lengths={lengths!r}"
        )
    pairs = max(batch_sizes) * heads * max(lengths) ** 2
    if pairs > MAX_CELL_PAIRS:
        raise ValueError(
            f"The grid's largest call holds {pairs} logits (batch * heads * length**2), more than {MAX_CELL_PAIRS}: "
            f"lower `lengths`, `batch_sizes` or `heads`. Received: lengths={lengths!r}, "
            f"batch_sizes={batch_sizes!r}, heads={heads!r}"
        )


def _allocator_keeps_statistics():
    import tensorflow as tf

    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, tf.errors.OpError):
        return False
    return True


def check_fit(calibration, rows):
    """Raises a `ValueError` when a fitted calibration has a coefficient that is not a finite number
    >= 0, or does not predict the times it was fitted to (per kernel and mode, the median ratio of
    predicted to measured time beyond `FIT_TOLERANCE` either way): such a fit is not written."""
    problem = cost_model.calibration_problem(calibration)
    if problem:
        raise ValueError(f"The fitted calibration is unusable ({problem}); nothing was written.")
    errors = {}
    for row in rows:
        coefficients = calibration["time"].get(row["name"], {}).get(row["cell"].mode)
        if coefficients is None or not row["seconds"] or not math.isfinite(row["seconds"]):
            continue
        features = cost_model.kernel_features(row["name"], row["cell"].call()).time
        predicted = sum(coefficients.get(feature, 0.0) * value for feature, value in features.items())
        ratio = predicted / row["seconds"]
        errors.setdefault((row["name"], row["cell"].mode), []).append(abs(math.log(ratio)) if ratio > 0 else math.inf)
    for (name, mode), values in sorted(errors.items()):
        median = sorted(values)[len(values) // 2]
        if median > math.log(FIT_TOLERANCE):
            raise ValueError(
                f"The fitted calibration mispredicts its own measurements of {name!r} ({mode}) by a median factor "
                f"of {math.exp(median):.3g} (more than {FIT_TOLERANCE:g}): the grid is too noisy or too small to "
                "fit; nothing was written. Measure more lengths or repeats on a quieter machine."
            )
