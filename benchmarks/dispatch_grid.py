"""The dispatcher's grid: every kernel's time and peak memory per call, the calibration fitted to
them, and how close `implementation="auto"` comes to the fastest admissible kernel.

Each cell of the grid (`keras_attn.dispatch.tuning.grid`: lengths x batch sizes x causal /
bidirectional / packed / windowed / strided, each as a forward call and a training call with and
without attention dropout; 8 heads of depth 64) runs every kernel that takes it and Keras's
layer's own attention (`_compute_attention`, the peer) in turn, as `auto` times them
(`--repeats` rounds at least, more for a call of milliseconds), keeping each one's best wall time
(forward and backward in training) and its first run's peak memory. A kernel whose pairwise tensors alone would pass `--cap-gb`, or that `"auto"` would not take
for unrolling too many steps into the graph, is not run in that cell.
The cost model is fitted to these measurements (`keras_attn.dispatch.tuning.fit`) and written to
`--calibration-output` (by default the calibration the package ships,
`keras_attn/dispatch/calibration.json`). Then, per cell, `auto` chooses as in a model (that
calibration admits and prunes the kernels, the contenders are timed, in a cache directory of the
run's own), and its choice is compared with the fastest kernel *admissible* by measurement (peak memory at most Keras's, or
both under `keras_attn.dispatch.tuning.MEMORY_FLOOR_BYTES`, the allocator's noise): the row's ratio
is `auto`'s time over that kernel's (1.0: `auto` took it), and the summary prints the share of
cells within 1.1x. The same measurements fit the model and
judge it, so the share is in-sample. With `--held-out`, nothing is fitted or written: `auto`
chooses under the shipped calibration, on a grid it was not fitted to (`HELD_OUT_ARGS`: other head
counts and depths, lengths between the calibration's, another batch size): the page's goal is `auto` within 1.1x in at least 95 % of those cells
(each row says whether it is `held_out`).

Peak memory is the peak of TensorFlow's CPU allocator over a step's first run (the script restarts
itself with `TF_CPU_ALLOCATOR_USE_BFC=true`, under which the allocator keeps that statistic): what
the step's tensors hold, without the process's other memory.

    python -m benchmarks.dispatch_grid                                     # the full grid
    python -m benchmarks.dispatch_grid --lengths 256 512 1024 2048 4096    # make bench's: the shipped calibration
    python -m benchmarks.dispatch_grid --lengths 256 512 1024 --batch-sizes 1   # a few minutes
    python -m benchmarks.run_all --only dispatch_grid --parts   # also the held-out grids, twice each
"""

import json
import os
import sys
import tempfile

from benchmarks import measurement

PEER_RATIO = "auto_vs_fastest_admissible"  # the rows' ratio to the peer measured in the same run
GOAL_FIELDS = ("auto", "fastest_admissible")  # the kernels the ratio compares: figures of a row, not its case
# `make bench`: the grid the shipped calibration is fitted to, lengths up to 4,096; longer calls are
# predicted by extrapolating the fitted coefficients (the full grid below adds 8,192 and 16,384,
# hours of a 2-core machine).
BENCH_ARGS = ["--lengths", "256", "512", "1024", "2048", "4096", "--batch-sizes", "1", "4"]
# Held out from the calibration's grid: lengths between its points, batch 2, other head counts and
# depths. Each is run twice (`make bench ARGS=--parts`; hours on 2 cores), both runs on the page.
HELD_OUT_ARGS = ["--held-out", "--lengths", "384", "768", "1536", "3072", "--batch-sizes", "2"]
BENCH_PARTS = {
    "held_out_heads4_depth32": [*HELD_OUT_ARGS, "--heads", "4", "--depth", "32"],
    "held_out_heads4_depth32_again": [*HELD_OUT_ARGS, "--heads", "4", "--depth", "32"],
    "held_out_heads12_depth128": [*HELD_OUT_ARGS, "--heads", "12", "--depth", "128"],
    "held_out_heads12_depth128_again": [*HELD_OUT_ARGS, "--heads", "12", "--depth", "128"],
}

LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_SIZES = (1, 4)
MAX_TOKENS = 4096  # batch x length per cell: larger batches only at the shorter lengths
# The goal (benchmarks/page.py): auto within 1.1x of the fastest admissible kernel in 95 % of the cells.
GOALS = (("auto_vs_fastest_admissible", "<=", 1.1, {"held_out": True}, 0.95),)
# The page's table: the held-out cells the goal is on (the in-sample ones are in the results file and the plot).
SUMMARY = (
    ("run", "setting", "mode", "dropout", "batch"),
    "length",
    ("auto_vs_fastest_admissible",),
    {"held_out": True},
)
WITHIN = GOALS[0][2]
ALLOCATOR_ENVIRONMENT = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}  # TensorFlow's CPU allocator keeps its peak


def _too_big(cell, name, cap_gb):
    """Whether a kernel's pairwise tensors alone would pass `cap_gb`, or it unrolls more steps into
    the graph than `"auto"` takes (`keras_attn.kernels.cost.MAX_UNROLLED_STEPS`: tracing thousands
    of the chunked kernel's chunks and tiles takes minutes)."""
    from keras_attn.dispatch import cost_model
    from keras_attn.kernels import cost

    features = cost_model.kernel_features(name, cell.call())
    held = features.memory["pairwise_bytes"] + features.memory["dropout_bytes"]
    return held > cap_gb * 2**30 or cost.unrolls_too_many_steps(features)


def measure_grid(cells, repeats, cap_gb):
    """The measured rows of every cell: one per implementation that runs in it."""
    from keras_attn.dispatch import cost_model
    from keras_attn.dispatch import tuning

    rows = []
    for cell in cells:
        names = [n for n in [*tuning.candidates(cell), cost_model.KERAS_DENSE] if not _too_big(cell, n, cap_gb)]
        for name, measured in tuning.measure(cell, names, repeats).items():
            rows.append({"cell": cell, "name": name, **measured})
        print(
            f"{cell.setting} {cell.mode} dropout={cell.dropout} b={cell.batch} L={cell.length}: "
            + ", ".join(
                f"{row['name']} {row['seconds'] * 1e3:.1f} ms {_mb(row['peak_bytes'])}" for row in rows[-len(names) :]
            ),
            flush=True,
        )
    return rows


def _mb(count):
    return "" if count is None else f"{count / 2**20:.0f} MB"


def _admissible(row, keras):
    """Whether a measured kernel held at most Keras's measured peak (both under the noise floor counts)."""
    from keras_attn.dispatch import tuning

    if keras is None or row["peak_bytes"] is None or keras["peak_bytes"] is None:
        return True
    return row["peak_bytes"] <= max(keras["peak_bytes"], tuning.MEMORY_FLOOR_BYTES)


def judge(cells, rows):
    """Per cell: `auto`'s choice, the fastest kernel admissible by measurement, and the ratio of their times."""
    from keras_attn.dispatch import cost_model

    judged = []
    for cell in cells:
        measured = {row["name"]: row for row in rows if row["cell"] == cell}
        keras = measured.get(cost_model.KERAS_DENSE)
        kernels = {name: row for name, row in measured.items() if name != cost_model.KERAS_DENSE}
        if not kernels:
            continue
        allowed = {name: row for name, row in kernels.items() if _admissible(row, keras)} or kernels
        fastest = min(allowed, key=lambda name: allowed[name]["seconds"])
        auto = cost_model.choose(cell.call())
        auto_seconds = kernels[auto]["seconds"] if auto in kernels else None
        judged.append(
            {
                "setting": cell.setting,
                "mode": cell.mode,
                "dropout": cell.dropout,
                "batch": cell.batch,
                "length": cell.length,
                "auto": auto,
                "fastest_admissible": fastest,
                "auto_admissible": auto in allowed,  # measured no heavier than Keras
                PEER_RATIO: None if auto_seconds is None else auto_seconds / allowed[fastest]["seconds"],
                "keras_peak_mb": None if keras is None or keras["peak_bytes"] is None else keras["peak_bytes"] / 2**20,
                **{f"{name}_ms": row["seconds"] * 1e3 for name, row in measured.items()},
                **{
                    f"{name}_peak_mb": row["peak_bytes"] / 2**20
                    for name, row in measured.items()
                    if row["peak_bytes"] is not None
                },
            }
        )
    return judged


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="+", default=list(LENGTHS)),
        batch_sizes=dict(type=int, nargs="+", default=list(BATCH_SIZES)),
        max_tokens=dict(type=int, default=MAX_TOKENS, help="largest batch x length of a cell"),
        heads=dict(type=int, default=8),
        depth=dict(type=int, default=64),
        repeats=dict(type=int, default=2),
        settings=dict(nargs="+", default=None, help="kinds of call (keras_attn.dispatch.tuning.SETTINGS; default all)"),
        cap_gb=dict(type=float, default=3.0, help="skip a kernel whose pairwise tensors pass this (GB)"),
        refit_from=dict(default=None, help="refit to the measurements of an earlier run's JSON instead of measuring"),
        calibration_output=dict(default=None, help="where to write the fitted calibration (default: the shipped one)"),
        held_out=dict(action="store_true", help="judge auto under the shipped calibration: nothing fitted or written"),
    )
    args = parser.parse_args(argv)
    if not args.smoke and any(os.environ.get(k) != v for k, v in ALLOCATOR_ENVIRONMENT.items()):
        os.execve(
            sys.executable,
            [sys.executable, "-m", "benchmarks.dispatch_grid", *sys.argv[1:]],
            {**os.environ, **ALLOCATOR_ENVIRONMENT},
        )
    from keras_attn.dispatch import cost_model
    from keras_attn.dispatch import tuning

    if args.smoke:
        args.lengths, args.batch_sizes, args.heads, args.depth, args.repeats = [32], [1], 2, 8, 1
        args.settings = ["causal"]
    output = args.calibration_output or str(cost_model.SHIPPED_CALIBRATION)
    if args.smoke and not args.calibration_output:  # a smoke run never replaces the shipped calibration
        output = os.path.splitext(args.output or os.path.join(measurement.RESULTS_DIR, "dispatch_grid_smoke"))[0]
        output += "_calibration.json"
    if args.refit_from:
        cells, rows = rows_from_results(args.refit_from)
    else:
        cells = [
            cell
            for cell in tuning.grid(
                args.lengths, args.batch_sizes, args.heads, args.depth, args.settings or tuning.SETTINGS
            )
            if cell.batch == 1 or cell.batch * cell.length <= args.max_tokens
        ]
        rows = measure_grid(cells, args.repeats, args.cap_gb)
    grid_description = {
        k: getattr(args, k)
        for k in ("lengths", "batch_sizes", "max_tokens", "heads", "depth", "repeats", "settings", "refit_from")
    }
    if args.held_out:
        shipped = json.loads(cost_model.SHIPPED_CALIBRATION.read_text(encoding="utf-8"))
        calibration = {"time": shipped["time"], "memory": shipped["memory"]}
    else:
        calibration = {"time": tuning.fit(rows, "time"), "memory": tuning.fit(rows, "memory")}
        tuning.write_calibration(calibration, output, grid_description)
        print(f"wrote the calibration {output}")
    judged = [{"held_out": args.held_out, **row} for row in judge_under(calibration, cells, rows)]
    ratios = [row[PEER_RATIO] for row in judged if row[PEER_RATIO] is not None]
    share = sum(ratio <= WITHIN for ratio in ratios) / max(1, len(ratios))
    measurement.print_table(
        judged,
        [
            ("setting", "setting", "{}"),
            ("mode", "mode", "{}"),
            ("dropout", "dropout", "{}"),
            ("batch", "batch", "{}"),
            ("length", "length", "{}"),
            ("auto", "auto", "{}"),
            ("fastest_admissible", "fastest admissible", "{}"),
            (PEER_RATIO, "auto / fastest", "{:.2f}"),
        ],
    )
    heavier = sum(not row["auto_admissible"] for row in judged)
    print(f"auto within {WITHIN}x of the fastest admissible kernel in {share:.0%} of {len(ratios)} cells")
    print(f"auto's kernel measured heavier than Keras's attention in {heavier} of {len(judged)} cells")
    payload = {
        "config": {**grid_description, "held_out": args.held_out},
        "share_within": share,
        "within": WITHIN,
        "cells_heavier_than_keras": heavier,
        "rows": judged,
    }
    measurement.write_results("dispatch_grid" + ("_smoke" if args.smoke else ""), payload, args.output)
    return judged


def rows_from_results(path):
    """The cells and measured rows of an earlier run's results JSON (what `judge` wrote)."""
    from keras_attn.dispatch import cost_model
    from keras_attn.dispatch import tuning

    results = json.loads(open(path, encoding="utf-8").read())
    heads, depth = results["config"]["heads"], results["config"]["depth"]
    cells, rows = [], []
    for row in results["rows"]:
        cell = tuning.Cell(row["batch"], row["length"], heads, depth, row["setting"], row["mode"], row["dropout"])
        cells.append(cell)
        for name in (*tuning.candidates(cell), cost_model.KERAS_DENSE):
            if f"{name}_ms" in row:
                peak = row.get(f"{name}_peak_mb")
                rows.append(
                    {
                        "cell": cell,
                        "name": name,
                        "seconds": row[f"{name}_ms"] / 1e3,
                        "peak_bytes": None if peak is None else peak * 2**20,
                    }
                )
    return cells, rows


def judge_under(calibration, cells, rows):
    """`judge` with `auto` choosing under `calibration` (as a user's calibration: the shipped one
    fills what it lacks), whatever calibration this process would read otherwise."""
    from keras_attn.dispatch import cost_model
    from keras_attn.dispatch import tuning

    previous = os.environ.get(cost_model.CACHE_ENV)
    with tempfile.TemporaryDirectory() as directory:
        tuning.write_calibration(calibration, os.path.join(directory, cost_model.CALIBRATION_FILE), {})
        os.environ[cost_model.CACHE_ENV] = directory
        cost_model.reload_calibration()
        try:
            return judge(cells, rows)
        finally:
            if previous is None:
                os.environ.pop(cost_model.CACHE_ENV)
            else:
                os.environ[cost_model.CACHE_ENV] = previous
            cost_model.reload_calibration()


if __name__ == "__main__":
    main(sys.argv[1:])
