"""Benchmark scripts (not tests): each prints a table and writes JSON to benchmarks/results/.

A script is a module of this folder that runs as `python -m benchmarks.<name>`, declares
`PEER_RATIO` (the row key of its ratio to the peer measured in the same run) and takes `--smoke`
and `--output`; `benchmark_scripts()` finds them all, for `make bench` (`benchmarks.run_all`) and
the tests' smoke runs.
"""

from pathlib import Path

from appkit.logs import quiet_tensorflow_import

quiet_tensorflow_import()  # before any module of the package imports TensorFlow

BENCHMARKS_DIR = Path(__file__).resolve().parent


def benchmark_scripts():
    """Every script of benchmarks/: a module that declares `PEER_RATIO` and runs as `python -m benchmarks.<name>`."""
    return sorted(path.stem for path in BENCHMARKS_DIR.glob("*.py") if _is_script(path.read_text(encoding="utf-8")))


def _is_script(source):
    return 'if __name__ == "__main__":' in source and "\nPEER_RATIO = " in source
