"""`make test-matrix`: the library's tests on every supported TensorFlow minor, each with the ends
of the Keras range pip accepts beside it, and the table of what ran.

    python -m benchmarks.version_matrix --install "ARGS" --pytest "ARGS" [--only TF-KERAS ...]
    python -m benchmarks.version_matrix --table   # only rewrite the table from the results

Each cell of `CELLS` gets a venv of its own, `.venv-matrix/<tensorflow>-<keras>/`, where pip
installs the cell's pins as constraints (`-c`: the resolver cannot move them) beside `--install`
(the Makefile's `COMPAT_INSTALL`: the library, its `viz` extra, the test runners). Then pytest runs
`--pytest` (the Makefile's `COMPAT_TESTS`, `make test-compat`'s selection) with `--junitxml`, one
cell at a time. Per cell, `RESULTS` gets the Python, TensorFlow, Keras, KerasHub and numpy versions
the venv holds, the passed/failed/skipped counts, the failed tests' names, the wall time and the
date; a cell run again replaces its row. From `RESULTS`, the table between the `make test-matrix`
markers of docs/supported_versions.md is rewritten (tests/test_version_matrix.py holds the table,
setup.cfg's ranges and the README's and the docs' claims to `CELLS` and the results).
"""

import argparse
import json
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime
from datetime import timezone

from benchmarks import BENCHMARKS_DIR

REPO_ROOT = BENCHMARKS_DIR.parent
VENVS_DIR = REPO_ROOT / ".venv-matrix"
RESULTS = BENCHMARKS_DIR / "results" / "version_matrix.json"
OLDEST_SUPPORTED = REPO_ROOT / "oldest-supported.txt"
TABLE_FILE = REPO_ROOT / "docs" / "supported_versions.md"
BEGIN_MARKER = "<!-- make test-matrix: generated from benchmarks/results/version_matrix.json; do not edit below -->"
END_MARKER = "<!-- make test-matrix: end of the generated section -->"

# (tensorflow, keras, keras-hub): per TensorFlow minor, the newest patch with the lowest and the
# highest Keras pip installs beside it (TensorFlow 2.21 requires Keras 3.12 or newer), and the newest
# KerasHub that installs with the pair (KerasHub 0.26 on requires Keras 3.13, 0.30 on Keras 3.15,
# 0.31 and 0.32 a tensorflow-text, hence a TensorFlow, of 2.20 or newer). The first cell is the
# oldest supported pair, oldest-supported.txt as it stands (`make test-compat`).
CELLS = (
    ("2.18.0", "3.10.0", "0.21.0"),
    ("2.18.1", "3.15.1", "0.30.0"),
    ("2.19.1", "3.10.0", "0.25.1"),
    ("2.19.1", "3.15.1", "0.30.0"),
    ("2.20.0", "3.10.0", "0.25.1"),
    ("2.20.0", "3.15.1", "0.32.0"),
    ("2.21.0", "3.12.0", "0.25.1"),
    ("2.21.0", "3.15.1", "0.32.0"),
)
VERSIONS_PROBE = (
    "import json, platform, numpy, tensorflow, keras, keras_hub; print(json.dumps({"
    "'python': platform.python_version(), 'tensorflow': tensorflow.__version__, 'keras': keras.version(), "
    "'keras_hub': keras_hub.__version__, 'numpy': numpy.__version__}))"
)


def cell_name(cell):
    """`<tensorflow>-<keras>`, the cell's venv and its `--only` name."""
    return f"{cell[0]}-{cell[1]}"


def constraints(cell):
    """The pins pip installs the cell with: oldest-supported.txt for the oldest cell (its numpy too)."""
    if cell == CELLS[0]:
        return OLDEST_SUPPORTED.read_text()
    tensorflow, keras, keras_hub = cell
    return f"tensorflow=={tensorflow}\nkeras=={keras}\nkeras-hub=={keras_hub}\n"


def install(cell, install_args):
    """The cell's venv with its pins and `install_args`; its python. pip runs unless the venv's
    stamp says it installed these pins and arguments last (as the Makefile's `.installed`)."""
    venv = VENVS_DIR / cell_name(cell)
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = f"{constraints(cell)}{shlex.join(install_args)}\n"
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    pins = venv / "constraints.txt"
    pins.write_text(constraints(cell))
    command = [str(python), "-m", "pip", "install", "--quiet", "-c", str(pins), "-r", str(pins), *install_args]
    subprocess.run(["nice", "-n", "10", *command], check=True, cwd=REPO_ROOT)
    stamp.write_text(wanted)
    return python


def junit_counts(path):
    """`(passed, failed, skipped, failed test ids)` from pytest's JUnit XML (errors count as failed)."""
    failed_ids, skipped, total = [], 0, 0
    for case in ElementTree.parse(path).iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed_ids.append(f"{case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            skipped += 1
    return total - len(failed_ids) - skipped, len(failed_ids), skipped, failed_ids


def run_cell(cell, python, pytest_args):
    """The cell's row: its versions, pytest's counts, the wall time and the date."""
    versions = json.loads(
        subprocess.run([str(python), "-c", VERSIONS_PROBE], check=True, capture_output=True, text=True).stdout
    )
    junit = python.parents[1] / "junit.xml"
    junit.unlink(missing_ok=True)
    start = time.perf_counter()
    command = ["nice", "-n", "10", str(python), "-m", "pytest", f"--junitxml={junit}", *pytest_args]
    print(f"== {cell_name(cell)}: {' '.join(command[3:])}", flush=True)
    status = subprocess.run(command, check=False, cwd=REPO_ROOT).returncode
    seconds = time.perf_counter() - start
    passed, failed, skipped, failed_ids = junit_counts(junit) if junit.exists() else (0, 1, 0, ["(no report)"])
    return {
        **versions,
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "failed_tests": failed_ids,
        "exit_status": status,
        "seconds": round(seconds),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def load_results():
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def table(results):
    """The Markdown table of the cells in `CELLS`' order: what ran, on what, with what outcome; the
    cells with no result yet named under it."""
    lines = [
        "| TensorFlow | Keras | KerasHub | Python | numpy | passed | failed | skipped | minutes | date |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    not_run = [cell for cell in CELLS if cell_name(cell) not in results]
    for cell in CELLS:
        row = results.get(cell_name(cell))
        if row is None:
            continue
        lines.append(
            f"| {row['tensorflow']} | {row['keras']} | {row['keras_hub']} | {row['python']} | {row['numpy']} "
            f"| {row['passed']} | {row['failed']} | {row['skipped']} | {row['seconds'] / 60:.0f} | {row['date']} |"
        )
    if not_run:
        cells = ", ".join(
            f"TensorFlow {tensorflow} with Keras {keras} (KerasHub {keras_hub})"
            for tensorflow, keras, keras_hub in not_run
        )
        lines += ["", f"Not run yet: {cells}."]
    return "\n".join(lines)


def generated_section(text):
    """The text between the markers of `text` (without them), or `None` when it has none."""
    if BEGIN_MARKER not in text:
        return None
    return text.split(BEGIN_MARKER, 1)[1].split(END_MARKER, 1)[0].strip("\n")


def write_table(results):
    """Replaces the generated section of `TABLE_FILE` by the table of `results`."""
    before, rest = TABLE_FILE.read_text().split(BEGIN_MARKER, 1)
    after = rest.split(END_MARKER, 1)[1]
    TABLE_FILE.write_text(f"{before}{BEGIN_MARKER}\n{table(results)}\n{END_MARKER}{after}")


def write_results(results):
    """`RESULTS` replaced whole (a temporary file renamed over it: never half written)."""
    partial = RESULTS.with_suffix(".json.partial")
    partial.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    partial.replace(RESULTS)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", default="", help="what pip installs beside the cell's pins (one string)")
    parser.add_argument("--pytest", default="", help="pytest's arguments (one string)")
    parser.add_argument("--only", nargs="+", metavar="TF-KERAS", help="run these cells only (e.g. 2.20.0-3.15.1)")
    parser.add_argument("--install-only", action="store_true", help="install the venvs, run no test")
    parser.add_argument("--table", action="store_true", help="only rewrite the table from the results")
    args = parser.parse_args(argv)
    names = [cell_name(cell) for cell in CELLS]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"--only takes cells of {', '.join(names)}. Received: {', '.join(unknown)}")
    if not args.table:
        for cell in CELLS:
            if args.only and cell_name(cell) not in args.only:
                continue
            python = install(cell, shlex.split(args.install))
            if not args.install_only:
                row = run_cell(cell, python, shlex.split(args.pytest))
                results = load_results()  # read after the run: another `--only` run may have written meanwhile
                results[cell_name(cell)] = row
                write_results(results)
    write_table(load_results())
    results = load_results()
    failing = [name for name, row in results.items() if row["failed"]]
    print(table(results))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
