"""Starts N workers of one command on loopback ports, each with its TF_CONFIG, and streams their logs.

    python -m pipelines.launch --workers 2 -- python -m pipelines.train_imdb --strategy multi_worker ...

Every line a worker prints comes out prefixed with `[worker i]`. Worker 0 is the chief. When a
worker fails, the others get `--grace-seconds` to fail on their own (their collectives time out)
and are then killed; the launcher's exit status is the first failure's (0 when all succeed). On a
real cluster, start the command once per machine with that machine's TF_CONFIG instead.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from appkit.cli import add_debug_flag
from appkit.cli import non_negative_float
from appkit.cli import positive_int
from appkit.cli import user_errors_exit


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_configs(count):
    """One TF_CONFIG (a JSON string) per worker of a loopback cluster of `count` workers."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(count)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}) for index in range(count)]


def _stream(process, prefix, output):
    for line in process.stdout:
        output.write(f"{prefix} {line}")
        output.flush()


def launch(command, workers, grace_seconds=120, output=sys.stdout):
    """Runs `command` as `workers` processes; returns the first non-zero exit status, else 0."""
    if workers < 1:
        raise ValueError(f"`workers` must be at least 1. Received: workers={workers}")
    if not command:
        raise ValueError("`command` is empty: give it after `--`. Received: command=[]")
    processes, streams = [], []
    for index, config in enumerate(tf_configs(workers)):
        env = {**os.environ, "TF_CONFIG": config, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        processes.append(process)
        stream = threading.Thread(target=_stream, args=(process, f"[worker {index}]", output), daemon=True)
        stream.start()
        streams.append(stream)
    status, failed_at = 0, None
    try:
        while any(process.poll() is None for process in processes):
            for index, process in enumerate(processes):
                if process.returncode not in (None, 0) and failed_at is None:
                    status, failed_at = process.returncode, time.monotonic()
                    output.write(f"[launch] worker {index} exited with {process.returncode}\n")
            if failed_at is not None and time.monotonic() - failed_at > grace_seconds:
                _stop(processes)
            time.sleep(0.2)
    except KeyboardInterrupt:
        _stop(processes)
        raise
    for stream in streams:
        stream.join()
    if status == 0:
        status = next((process.returncode for process in processes if process.returncode), 0)
    return status


def _stop(processes):
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.launch",
        description=__doc__.split("\n")[0],
        usage="python -m pipelines.launch [--workers N] [--grace-seconds S] [--debug] -- COMMAND ...",
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes (worker 0 is the chief)")
    parser.add_argument(
        "--grace-seconds", type=non_negative_float, default=120, help="after a failure, before killing the rest"
    )
    add_debug_flag(parser)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # `--help` prints the usage here, with or without a command
    if split == len(argv):
        parser.error("no command: give it after `--`, e.g. -- python -m pipelines.train_imdb --strategy multi_worker")
    with user_errors_exit(parser.prog, args.debug):  # an empty or missing command: one line, exit 2
        return launch(argv[split + 1 :], args.workers, args.grace_seconds)


if __name__ == "__main__":
    sys.exit(main())
