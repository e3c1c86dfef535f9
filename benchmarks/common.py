"""Shared harness of the benchmark scripts: timing, the matmul peak, tables and JSON results.

Every script measures its peer in the same run and reports ratios, so figures from a noisy,
shared machine stay comparable. Results go to `benchmarks/results/<name>.json` (atomic write).
"""

import argparse
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(description, **extra):
    """`--smoke` (seconds, tiny sizes; what the test suite runs) and `--output` for every script."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds; for tests")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/<name>.json)")
    for flag, options in extra.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", **options)
    return parser


def best_seconds_round_robin(steps, rounds, warmup=1):
    """`{name: best wall time}` of the `steps` (name -> callable), run in turn `rounds` times.

    Running the candidates in turn, and keeping each one's best time, evens out the load of a
    shared machine between them: interference only ever adds time.
    """
    for step in steps.values():
        for _ in range(warmup):
            _materialise(step())
    best = {name: float("inf") for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            _materialise(step())
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _materialise(result):
    for tensor in tf.nest.flatten(result):
        if hasattr(tensor, "numpy"):
            tensor.numpy()


def matmul_step(size=1024):
    """A compiled float32 `(size, size) @ (size, size)` and its FLOPs, to measure the matmul peak."""
    a = tf.random.normal((size, size))
    b = tf.random.normal((size, size))
    return tf.function(lambda: tf.matmul(a, b)), 2 * size**3


def machine():
    """What the figures were measured on: CPU count, load, versions."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    import keras

    return {
        "cpus": os.cpu_count(),
        "load_average": load,
        "platform": platform.platform(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def print_table(rows, columns):
    """Prints `rows` (dicts) as an aligned table of `columns` (key, header, format)."""
    headers = [header for _, header, _ in columns]
    cells = [[("-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for cell_row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(cell_row, widths)))


def write_results(name, payload, output=None):
    """Atomically writes `payload` (plus the machine description) as JSON; returns the path."""
    from models.files import write_json_atomic

    path = output or os.path.join(RESULTS_DIR, f"{name}.json")
    write_json_atomic(path, {"benchmark": name, "machine": machine(), **payload})
    print(f"wrote {path}")
    return path


def imdb_test_reviews(count):
    """`count` (text, label) test reviews of the local IMDB data (never downloaded).

    Read through `pipelines.imdb_data`'s decode-once cache, whose seeded shuffled order mixes
    both classes (the archive lists every positive review before the negatives).
    """
    from pipelines.imdb_data import load_cache

    records = load_cache(allow_download=False).records("test").take(count)
    return [(text.decode("utf-8"), int(label)) for text, label in records.as_numpy_iterator()]
