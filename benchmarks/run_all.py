"""`make bench`: every benchmark script in turn, then one summary of their ratios, with a plot each.

    python -m benchmarks.run_all [--only NAME ...] [--skip NAME ...] [--smoke] [--results-dir DIR]

Each script of `benchmarks/` (`benchmarks.benchmark_scripts()`) runs in a process of its own as
`python -m benchmarks.<name>`, with the arguments it declares for this run (`BENCH_ARGS`, a list;
none: its own defaults) and `--output <results-dir>/<name>.json`. The results directory is
`benchmarks/results/make_bench/`: the JSON files directly in `benchmarks/results/` are the runs
that BENCHMARKS.md's own sections quote, with their own arguments, and stay as they are. Then,
from those JSON files:

- `<results-dir>/summary.md`: per script, its wall time, the load it ran under, and a table of
  its rows: their text and integer fields (what a row is), the ratio to its peer (`PEER_RATIO`)
  and the figures its goals are stated in (`GOAL_FIELDS`, a tuple of row keys, when it has goals
  beyond that ratio);
- `<results-dir>/<name>.png`: that ratio per row as a bar chart (1.0 marked: the peer);
- BENCHMARKS.md's generated section (between its `make bench` markers) replaced by the summary,
  unless `--smoke` (tiny sizes, a few seconds a script, for tests: the figures mean nothing).

A script that fails is reported in the summary with its exit status, and the run goes on; the
command exits 1 if any failed. The total wall time is printed (the goal of `make bench`: 20 min).
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import BENCHMARKS_DIR
from benchmarks import benchmark_scripts

RESULTS_DIR = BENCHMARKS_DIR / "results" / "make_bench"
BENCHMARKS_MD = BENCHMARKS_DIR.parent / "BENCHMARKS.md"
BEGIN_MARKER = "<!-- make bench: generated from benchmarks/results by benchmarks/run_all.py; do not edit below -->"
END_MARKER = "<!-- make bench: end of the generated section -->"


def run_script(name, results_dir, smoke):
    """Runs one script in a fresh process; `(exit status, wall seconds)`."""
    module = importlib.import_module(f"benchmarks.{name}")
    arguments = ["--smoke"] if smoke else list(getattr(module, "BENCH_ARGS", []))
    command = [sys.executable, "-m", f"benchmarks.{name}", *arguments, "--output", str(results_dir / f"{name}.json")]
    print(f"== {name}: {' '.join(command[2:])}", flush=True)
    start = time.perf_counter()
    status = subprocess.run(command, check=False).returncode
    return status, time.perf_counter() - start


def describing_fields(rows, ratio):
    """The fields that say what a row is: text, booleans and integers, in the rows' order."""
    fields = []
    for row in rows:
        for key, value in row.items():
            if key != ratio and key not in fields and isinstance(value, (str, bool, int)) and value is not None:
                fields.append(key)
    return fields


def table(rows, ratio, goals=()):
    """A Markdown table of the rows' describing fields, their ratio to the peer, and the `goals`
    fields (the figures an issue's goal is about, a script's `GOAL_FIELDS`)."""
    fields = describing_fields(rows, ratio)
    fields = [field for field in fields if field not in goals]
    columns = fields + [ratio, *goals]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        value = row.get(ratio)
        cells = [str(row.get(field, "")) for field in fields] + ["-" if value is None else f"{value:.2f}"]
        cells += [_figure(row.get(goal)) for goal in goals]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figure(value):
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plot(name, rows, ratio, path):
    """A bar chart of each row's ratio to the peer, written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fields = describing_fields(rows, ratio)
    labels = [" ".join(str(row.get(field, "")) for field in fields) for row in rows]
    values = [row.get(ratio) or 0.0 for row in rows]
    figure, axes = pyplot.subplots(figsize=(8, 0.3 * len(rows) + 1.2))
    axes.barh(range(len(rows)), values)
    axes.set_yticks(range(len(rows)), labels, fontsize=7)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.invert_yaxis()
    axes.set_xlabel(ratio)
    axes.set_title(name)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def shown_path(path):
    """`path` as BENCHMARKS.md names it: relative to the repository root when inside it."""
    path = Path(path).resolve()
    return path.relative_to(BENCHMARKS_MD.parent) if path.is_relative_to(BENCHMARKS_MD.parent) else path


def summary_section(name, status, seconds, results_dir):
    """The summary of one script: its status, time, load, table, and its plot written beside it."""
    heading = f"### `{name}` ({seconds:.0f} s)"
    path = results_dir / f"{name}.json"
    if status != 0 or not path.is_file():
        return f"{heading}\n\nfailed: exit status {status}, no results written.\n"
    result = json.loads(path.read_text(encoding="utf-8"))
    module = importlib.import_module(f"benchmarks.{name}")
    ratio, goals = module.PEER_RATIO, tuple(getattr(module, "GOAL_FIELDS", ()))
    load = result["machine"]["load_average"]
    plot(name, result["rows"], ratio, results_dir / f"{name}.png")
    return (
        f"{heading}\n\nMeasured {result['machine']['time_utc']} UTC at load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {result['machine']['cpus']} cores; "
        f"plot: `{shown_path(results_dir / f'{name}.png')}`.\n\n{table(result['rows'], ratio, goals)}\n"
    )


def replace_generated_section(markdown, summary):
    """`markdown` with the text between the markers replaced by `summary` (markers appended if absent)."""
    if BEGIN_MARKER not in markdown:
        markdown = (
            markdown.rstrip("\n")
            + f"\n\n## `make bench`: the latest run of every script\n\n{BEGIN_MARKER}\n{END_MARKER}\n"
        )
    head, rest = markdown.split(BEGIN_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    return f"{head}{BEGIN_MARKER}\n{summary}{END_MARKER}{tail}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=benchmark_scripts(), help="run these scripts only")
    parser.add_argument("--skip", nargs="+", default=[], choices=benchmark_scripts(), help="scripts not to run")
    parser.add_argument(
        "--smoke", action="store_true", help="every script with --smoke (tests); BENCHMARKS.md untouched"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    names = [name for name in (args.only or benchmark_scripts()) if name not in args.skip]
    os.makedirs(args.results_dir, exist_ok=True)
    start = time.perf_counter()
    outcomes = {name: run_script(name, args.results_dir, args.smoke) for name in names}
    total = time.perf_counter() - start
    sections = [
        summary_section(name, status, seconds, args.results_dir) for name, (status, seconds) in outcomes.items()
    ]
    summary = f"`make bench` ran {len(names)} scripts in {total / 60:.1f} min.\n\n" + "\n".join(sections)
    (args.results_dir / "summary.md").write_text(summary, encoding="utf-8")
    if not args.smoke:
        BENCHMARKS_MD.write_text(
            replace_generated_section(BENCHMARKS_MD.read_text(encoding="utf-8"), summary), encoding="utf-8"
        )
    failed = [name for name, (status, _) in outcomes.items() if status != 0]
    print(f"{len(names)} scripts in {total / 60:.1f} min; failed: {', '.join(failed) or 'none'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
