"""`make bench`: every benchmark script in turn, then the benchmarks page made from their results.

    python -m benchmarks.run_all [--only NAME ...] [--skip NAME ...] [--smoke] [--render-only]
                                 [--parts] [--results-dir DIR]

Each script of `benchmarks/` (`benchmarks.benchmark_scripts()`) runs in a process of its own as
`python -m benchmarks.<name>`, with the arguments it declares for this run (`BENCH_ARGS`, a list;
none: its own defaults) and `--output <results-dir>/<name>.json`, replacing that script's
results there (its parts too, `<name>.<part>.json`). With `--parts`, a script's further runs
(`BENCH_PARTS`, a dict of part name to arguments, e.g. the dispatcher's held-out grids: longer
than `make bench`'s budget) follow, each to `<name>.<part>.json`. The results directory is
`benchmarks/results/make_bench/`. Then `benchmarks.page` makes, from every results file in that
directory (the scripts just run and the others), a plot per script beside its results and the
page, BENCHMARKS.md; the docs site's page is made from the same files when the site is built
(docs/benchmarks_page.py).

`--render-only` runs nothing: the page and the plots made again from the results as they are.
`--smoke` runs every script with tiny sizes (a few seconds each, for tests: the figures mean
nothing) and writes the page to `<results-dir>/BENCHMARKS.md`, leaving BENCHMARKS.md untouched.

A script that fails is reported with its exit status, and the run goes on; the command exits 1
if any failed. The total wall time is printed (the goal of `make bench`: 20 min).
"""

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import benchmark_scripts
from benchmarks import page


def run_script(name, results_dir, smoke, parts=False):
    """Runs one script in fresh processes (its `BENCH_PARTS` too with `parts`), its earlier results
    in `results_dir` replaced; whether every run succeeded."""
    module = importlib.import_module(f"benchmarks.{name}")
    runs = {None: ["--smoke"] if smoke else list(getattr(module, "BENCH_ARGS", []))}
    if parts and not smoke:
        runs.update(getattr(module, "BENCH_PARTS", {}))
    for path in [results_dir / f"{name}.json", *page.stale_parts(results_dir, name)]:
        path.unlink(missing_ok=True)  # a failed run must not leave the page an older run's figures
    statuses = [_run(name, arguments, results_dir / page.result_name(name, part)) for part, arguments in runs.items()]
    return all(status == 0 for status in statuses)


def _run(name, arguments, output):
    command = [sys.executable, "-m", f"benchmarks.{name}", *arguments, "--output", str(output)]
    print(f"== {name}: {' '.join(command[2:])}", flush=True)
    start = time.perf_counter()
    status = subprocess.run(command, check=False).returncode
    print(f"== {name}: exit status {status} in {time.perf_counter() - start:.0f} s", flush=True)
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=benchmark_scripts(), help="run these scripts only")
    parser.add_argument("--skip", nargs="+", default=[], choices=benchmark_scripts(), help="scripts not to run")
    parser.add_argument(
        "--smoke", action="store_true", help="every script with --smoke (tests); BENCHMARKS.md untouched"
    )
    parser.add_argument("--render-only", action="store_true", help="run nothing: the page made again from the results")
    parser.add_argument("--parts", action="store_true", help="also the scripts' further runs (BENCH_PARTS)")
    parser.add_argument("--results-dir", type=Path, default=page.RESULTS_DIR)
    args = parser.parse_args(argv)
    names = [] if args.render_only else [name for name in (args.only or benchmark_scripts()) if name not in args.skip]
    os.makedirs(args.results_dir, exist_ok=True)
    start = time.perf_counter()
    failed = [name for name in names if not run_script(name, args.results_dir, args.smoke, args.parts)]
    written = page.render(args.results_dir, args.results_dir / "BENCHMARKS.md" if args.smoke else page.BENCHMARKS_MD)
    print(
        f"{len(names)} scripts in {(time.perf_counter() - start) / 60:.1f} min; failed: {', '.join(failed) or 'none'}"
    )
    print(f"wrote {written}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
