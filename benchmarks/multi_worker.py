"""Multi-worker training of the IMDB classifier: 1 worker vs 2 loopback workers, and a lost worker.

Each worker is a `python -m pipelines.train_imdb --strategy multi_worker` process pinned to a
core of its own (`sched_setaffinity`, one TensorFlow thread per pool), so 2 workers have twice
the compute of 1 and the ratio shows what the strategy's communication costs. Both runs train
the same model on the same global batches; the throughput is the training examples per second
of the epochs after the first (tracing), validation included, from the chief's `history.csv`.
Then two workers train again, worker 1 is killed (`SIGKILL`) after the first checkpoint, and the
time until worker 0 exits (non-zero) is measured.

    python -m benchmarks.multi_worker
"""

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import measurement
from pipelines import imdb_data
from pipelines import launch

PEER_RATIO = "two_over_one_worker"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = ["--max-train", "512", "--epochs", "2"]  # `make bench` (benchmarks/run_all.py): a smaller run

_ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def start_workers(count, arguments, output_dir):
    """`count` train_imdb workers on loopback ports, worker i pinned to core i (modulo the cores)."""
    command = [
        sys.executable,
        "-m",
        "pipelines.train_imdb",
        "--strategy",
        "multi_worker",
        "--output-dir",
        str(output_dir),
        *arguments,
    ]
    workers = []
    for index, config in enumerate(launch.tf_configs(count)):
        core = {index % os.cpu_count()}
        workers.append(
            subprocess.Popen(
                command,
                env={**os.environ, **_ONE_THREAD, "TF_CONFIG": config},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=lambda core=core: os.sched_setaffinity(0, core),
            )
        )
    return workers


def throughput(count, arguments, examples, output_dir):
    workers = start_workers(count, arguments, output_dir)
    outputs = [worker.communicate()[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        if worker.returncode:
            raise RuntimeError(f"a worker failed ({worker.returncode}):\n{output[-3000:]}")
    with open(Path(output_dir) / "history.csv", newline="") as file:
        seconds = [float(row["epoch_seconds"]) for row in csv.DictReader(file)][1:]
    return examples * len(seconds) / sum(seconds)


def seconds_to_exit_after_a_kill(arguments, output_dir, timeout):
    workers = start_workers(2, arguments, output_dir)
    checkpoints = Path(output_dir) / "checkpoints"
    try:
        while not list(checkpoints.glob("ckpt-*.index")):
            if any(worker.poll() is not None for worker in workers):
                raise RuntimeError(f"a worker ended before the kill:\n{workers[0].communicate()[0][-3000:]}")
            time.sleep(0.1)
        workers[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        status = workers[0].wait(timeout=timeout + 120)
        return time.monotonic() - killed, status
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate()


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        max_train=dict(type=int, default=1024, help="training reviews"),
        batch_size=dict(type=int, default=32, help="global batch"),
        epochs=dict(type=int, default=3, help="the first is not timed"),
        collective_timeout=dict(type=int, default=120, help="generous: the machine is shared"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.max_train, args.batch_size, args.epochs = 64, 8, 2
    imdb_data.load_cache(allow_download=False)  # decoded once, before the workers read it

    def training(epochs, *extra):
        return [
            "--smoke",
            "--no-download",
            "--max-train",
            str(args.max_train),
            "--batch-size",
            str(args.batch_size),
            "--epochs",
            str(epochs),
            "--patience",
            str(epochs),
            "--collective-timeout",
            str(args.collective_timeout),
            *extra,
        ]

    examples = (args.max_train // args.batch_size) * args.batch_size  # approximately: buckets drop remainders
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in (1, 2):
            rate = throughput(count, training(args.epochs), examples, Path(scratch) / f"workers{count}")
            rows.append({"workers": count, "examples_per_second": rate})
        rows[1]["two_over_one_worker"] = rows[1]["examples_per_second"] / rows[0]["examples_per_second"]
        fault = training(1_000, "--checkpoint-every", "2")  # killed long before the end
        seconds, status = seconds_to_exit_after_a_kill(fault, Path(scratch) / "fault", args.collective_timeout)
    rows.append({"workers": 2, "kill_to_exit_seconds": seconds, "survivor_status": status})
    measurement.print_table(
        rows,
        [
            ("workers", "workers", "{}"),
            ("examples_per_second", "examples/s", "{:.1f}"),
            ("two_over_one_worker", "2 / 1", "{:.2f}"),
            ("kill_to_exit_seconds", "kill -> exit s", "{:.1f}"),
            ("survivor_status", "exit status", "{}"),
        ],
    )
    name = "multi_worker" + ("_smoke" if args.smoke else "")
    measurement.write_results(name, {"settings": vars(args), "rows": rows}, args.output)
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
