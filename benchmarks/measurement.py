"""How every benchmark script measures and reports: timing (round robin, the matmul peak), memory
(peak RSS, a watched child process per case), the machine and its load, tables and JSON results.

Every script measures its peer in the same run and reports ratios, so figures from a noisy,
shared machine stay comparable. Results go to `benchmarks/results/<name>.json` (atomic write).
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(description, **extra):
    """`--smoke` (seconds, tiny sizes; what the test suite runs) and `--output` for every script."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds; for tests")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/<name>.json)")
    for flag, options in extra.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", **options)
    return parser


def best_seconds_round_robin(steps, rounds, warmup=1, cpu_seconds=None):
    """`{name: best wall time}` of the `steps` (name -> callable), run in turn `rounds` times.

    Running the candidates in turn, and keeping each one's best time, evens out the load of a
    shared machine between them: interference only ever adds time. A `cpu_seconds` dict, when
    given, receives each step's best CPU time of this process (all its threads): the work a step
    costs, which other processes on the cores stretch far less than its wall time.
    """
    for step in steps.values():
        for _ in range(warmup):
            _materialise(step())
    best = {name: float("inf") for name in steps}
    cpu = {name: float("inf") for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            cpu_start, start = time.process_time(), time.perf_counter()
            _materialise(step())
            best[name] = min(best[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - cpu_start)
    if cpu_seconds is not None:
        cpu_seconds.update(cpu)
    return best


def _materialise(result):
    for tensor in tf.nest.flatten(result):
        if hasattr(tensor, "numpy"):
            tensor.numpy()


def matmul_step(size=1024, dtype="float32"):
    """A compiled `(size, size) @ (size, size)` in `dtype` and its FLOPs, to measure the matmul peak."""
    a = tf.cast(tf.random.normal((size, size)), dtype)
    b = tf.cast(tf.random.normal((size, size)), dtype)
    return tf.function(lambda: tf.matmul(a, b)), 2 * size**3


def machine():
    """What the figures were measured on: CPU count and model, load, versions."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    import keras

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_average": load,
        "platform": platform.platform(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or None


def command(name, argv):
    """The command that reruns script `name` with `argv`, to record beside its results: an
    `--output` inside the repository made relative to it, so that it can be copied from the
    benchmarks page.

    >>> command("layer_throughput", ["--repeats", "3", "--output", f"{REPO_ROOT}/benchmarks/results/x.json"])
    'python -m benchmarks.layer_throughput --repeats 3 --output benchmarks/results/x.json'
    """
    words = list(argv)
    for index, word in enumerate(words[:-1]):
        path = os.path.abspath(words[index + 1])
        if word == "--output" and os.path.commonpath([path, REPO_ROOT]) == REPO_ROOT:
            words[index + 1] = os.path.relpath(path, REPO_ROOT)
    return " ".join(["python", "-m", f"benchmarks.{name}", *words])


def print_table(rows, columns):
    """Prints `rows` (dicts) as an aligned table of `columns` (key, header, format)."""
    headers = [header for _, header, _ in columns]
    cells = [[("-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for cell_row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(cell_row, widths)))


def write_results(name, payload, output=None):
    """Atomically writes `payload` (plus the machine description and the command that reran it)
    as JSON; returns the path.

    The command is this process's own when it runs the script (`python -m benchmarks.<script>`,
    as `make bench` does), else none (a test calling the script's `main`).
    """
    from appkit.files import write_json_atomic

    path = output or os.path.join(RESULTS_DIR, f"{name}.json")
    conditions = machine()
    script = name.removesuffix("_smoke")
    ran = os.path.basename(sys.argv[0]) == f"{script}.py"
    record = {"benchmark": name, "machine": conditions, "command": command(script, sys.argv[1:]) if ran else None}
    write_json_atomic(path, {**record, **payload})
    print(f"wrote {path} ({describe_load(conditions)})")
    return path


def describe_load(conditions):
    """The run's conditions as a script prints them: the load on the cores, not what else ran.

    >>> describe_load({"cpus": 2, "load_average": (1.43, 1.2, 1.1)})
    'load average 1.43 / 1.20 / 1.10 (1, 5, 15 min) on 2 cores'
    """
    load = conditions["load_average"]
    if load is None:
        return f"load average unknown on {conditions['cpus']} cores"
    return f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1, 5, 15 min) on {conditions['cpus']} cores"


def imdb_test_reviews(count):
    """`count` (text, label) test reviews of the local IMDB data (never downloaded).

    Read through `pipelines.imdb_data`'s decode-once cache, whose seeded shuffled order mixes
    both classes (the archive lists every positive review before the negatives).
    """
    from pipelines.imdb_data import load_cache

    records = load_cache(allow_download=False).records("test").take(count)
    return [(text.decode("utf-8"), int(label)) for text, label in records.as_numpy_iterator()]


def peak_rss_gb():
    """This process's peak resident set size in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def time_one_step(layer, call, mode, inputs):
    """One step of `call(inputs)`, timed: `(seconds, peak_rss_gb just before it)`.

    `mode` is `"forward"` or `"forward_backward"` (gradients of the input and of `layer`'s
    weights), both inside `tf.function`; the weights are built and the step traced before the
    timed call.
    """

    @tf.function
    def forward(x):
        return call(x)

    @tf.function
    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(forward(x) ** 2)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    call(inputs[:, :8])  # builds the weights
    step = forward if mode == "forward" else forward_backward
    step.get_concrete_function(inputs)  # traces outside the timed call
    before = peak_rss_gb()
    start = time.perf_counter()
    _materialise(step(inputs))
    return time.perf_counter() - start, before


def report_causal_self_attention_call(layer, mode, length, width, baseline_rss_gb):
    """In a fresh child: one causal self-attention call of `layer` on `(1, length, width)`, timed.

    `mode` as for `time_one_step`. Prints the JSON line that `run_watched_child` reads back: the
    call's `seconds`, the process's `peak_rss_gb` and `baseline_rss_gb` (the peak before the layer
    was built).
    """
    inputs = tf.random.normal((1, length, width))
    seconds, _ = time_one_step(layer, lambda x: layer(x, x, use_causal_mask=True), mode, inputs)
    print(json.dumps({"seconds": seconds, "peak_rss_gb": peak_rss_gb(), "baseline_rss_gb": baseline_rss_gb}))


def _memory_gb(field):
    """`VmRSS` (resident now) or `VmHWM` (its peak) of this process, in GB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    raise OSError(f"no {field} in /proc/self/status")


def first_run_peak(step):
    """Runs the traced `step` once; `{"peak_rss_gb", "step_gb", "rss_before_step_gb"}` of it.

    The process's peak RSS is reset to its current RSS first (`/proc/self/clear_refs`, Linux), so
    `step_gb` (the peak over the RSS before the run) is what the step holds at its peak (its graph
    optimisation included), whatever the imports took. The first run, as a steady-state step
    would reuse memory the allocator kept from an earlier one.
    """
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM := VmRSS
    before = _memory_gb("VmRSS")
    _materialise(step())
    peak = _memory_gb("VmHWM")
    return {"peak_rss_gb": peak, "step_gb": peak - before, "rss_before_step_gb": before}


def _rss_gb(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run_watched_child(arguments, cap_gb, max_seconds=None):
    """Runs `python <arguments>` in a fresh process from the repository root, killed above
    `cap_gb` of RSS (or after `max_seconds`, when given); returns `{"status": "ok", **its last
    JSON line}` or the status it ended with."""
    child = subprocess.Popen(
        [sys.executable, *arguments], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    watched_peak, start = 0.0, time.monotonic()
    while child.poll() is None:
        watched_peak = max(watched_peak, _rss_gb(child.pid))
        over_time = max_seconds is not None and time.monotonic() - start > max_seconds
        if watched_peak > cap_gb or over_time:
            child.kill()
            child.wait()
            status = f"over time ({max_seconds:g} s)" if over_time else f"over cap ({cap_gb:g} GB)"
            return {"status": status, "peak_rss_gb": watched_peak}
        time.sleep(0.05)
    output = child.stdout.read().strip().splitlines()
    if child.returncode != 0 or not output:
        return {"status": f"failed (exit {child.returncode})", "peak_rss_gb": watched_peak}
    return {"status": "ok", **json.loads(output[-1])}
