"""Time and peak memory of sparse attention patterns vs dense causal attention, by length.

`scaled_dot_product_attention` (the op, no projections) on `(1, length, 8, 32)` query, key and
value (width 256, 8 heads, depth 32) under `Causal() & (SlidingWindow(256) | Strided(256))` (the
Sparse Transformer's strided pattern; `--stride`) and `BlockLocal(256)`, against dense causal attention
(`is_causal=True`), all with `implementation="auto"` (each row says which kernel it took).
Forward, and forward + backward (gradients of query, key and value), inside `tf.function`.
Each (case, mode, length) runs in a fresh subprocess that reports its peak resident set size
(`resource.getrusage`), the RSS before the inputs were made, and the best wall time of
`--repeats` calls after one warm-up call (one call from `--single-call-from` on); the parent kills
a child whose RSS passes `--cap-gb` and stops growing that case's length.

    nice python -m benchmarks.sparse_patterns
    nice python -m benchmarks.sparse_patterns --lengths 4096 16384 --dense-max-length 16384
    nice python -m benchmarks.sparse_patterns --cases dense_causal causal_strided --modes forward_backward \
        --lengths 16384 65536 --update    # rerun some points, keep the file's other rows

With `--update` the rows run replace those of the same case, mode and length in the results file;
every row carries the UTC time its run finished (`run_finished_utc`), and each speedup compares
rows of one run.
"""

import argparse
import datetime
import json
import os
import sys

from benchmarks import measurement

LENGTH_PLOT = (("case", "mode"), ("seconds", "attention_gb"))  # benchmarks/page.py
PEER_RATIO = (
    "speedup_vs_dense_causal"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
)
BENCH_ARGS = [
    "--lengths",
    "16384",
    "--modes",
    "forward_backward",
]  # `make bench` (benchmarks/run_all.py): fwd+bwd at the targets' 16,384 (65,536: the script's defaults)

LENGTHS = (4096, 16384, 65536)
CASES = ("dense_causal", "causal_strided", "block_local")
MODES = ("forward", "forward_backward")
HEADS, DEPTH, STRIDE = 8, 32, 256


def case_arguments(case, stride):
    """Keyword arguments of `scaled_dot_product_attention` for a case."""
    from keras_attn.patterns import BlockLocal
    from keras_attn.patterns import Causal
    from keras_attn.patterns import SlidingWindow
    from keras_attn.patterns import Strided

    if case == "dense_causal":
        return {"is_causal": True}
    if case == "causal_strided":
        return {"pattern": Causal() & (SlidingWindow(stride) | Strided(stride))}
    return {"pattern": BlockLocal(stride)}


def run_child(case, mode, length, heads, depth, stride, repeats):
    """In the child: one case at one length; prints a JSON line."""
    import tensorflow as tf

    from keras_attn import patterns
    from keras_attn.dispatch import attention
    from keras_attn.kernels.call import AttentionCall

    baseline = measurement.peak_rss_gb()
    arguments = case_arguments(case, stride)
    query, key, value = (tf.random.normal((1, length, heads, depth)) for _ in range(3))
    pattern = patterns.from_shorthands(arguments.get("pattern"), arguments.get("is_causal", False))
    kernel = attention._choose_implementation(
        "auto", AttentionCall(query, key, value, pattern=pattern, scale=depth**-0.5)
    )

    def forward(query, key, value):
        return attention.scaled_dot_product_attention(query, key, value, **arguments)

    def forward_backward(query, key, value):
        with tf.GradientTape() as tape:
            tape.watch([query, key, value])
            loss = tf.reduce_sum(forward(query, key, value) ** 2)
        return tape.gradient(loss, [query, key, value])

    step = tf.function(forward if mode == "forward" else forward_backward)
    seconds = measurement.best_seconds_round_robin({case: lambda: step(query, key, value)}, rounds=repeats)[case]
    print(
        json.dumps(
            {
                "kernel": kernel,
                "seconds": seconds,
                "peak_rss_gb": measurement.peak_rss_gb(),
                "baseline_rss_gb": baseline,
            }
        )
    )


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="*", default=list(LENGTHS)),
        cases=dict(nargs="*", choices=CASES, default=list(CASES)),
        modes=dict(nargs="*", choices=MODES, default=list(MODES)),
        update=dict(action="store_true", help="replace only the rows run in the results file"),
        dense_max_length=dict(type=int, default=16384, help="dense causal runs only up to this length"),
        repeats=dict(type=int, default=2, help="timed calls per child (best kept)"),
        single_call_from=dict(type=int, default=65536, help="one timed call from this length on"),
        heads=dict(type=int, default=HEADS),
        depth=dict(type=int, default=DEPTH),
        stride=dict(type=int, default=STRIDE, help="stride, window and block size of the patterns"),
        cap_gb=dict(type=float, default=10.0, help="kill a child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        case=dict(choices=CASES, help=argparse.SUPPRESS),
        mode=dict(choices=MODES, help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.case, args.mode, args.length, args.heads, args.depth, args.stride, args.repeats)
    if args.smoke:  # long enough for the strided pattern to leave most keys out
        args.lengths, args.dense_max_length, args.heads, args.depth, args.stride, args.repeats = (
            [2048],
            2048,
            2,
            8,
            32,
            1,
        )
    rows = []
    for mode in args.modes:
        for length in args.lengths:
            for case in args.cases:
                row = _measure(case, mode, length, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    _add_ratios(rows)
    finished = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [{**row, "run_finished_utc": finished} for row in rows]
    measurement.print_table(
        rows,
        [
            ("mode", "mode", "{}"),
            ("length", "length", "{}"),
            ("case", "case", "{}"),
            ("kernel", "kernel", "{}"),
            ("status", "status", "{}"),
            ("seconds", "seconds", "{:.3f}"),
            ("speedup_vs_dense_causal", "x faster than dense causal", "{:.1f}"),
            ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
            ("attention_gb", "above baseline GB", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "case", "mode", "length")}
    name = "sparse_patterns" + ("_smoke" if args.smoke else "")
    payload = {"config": config, "rows": rows}
    if args.update:
        payload = _updated(args.output or os.path.join(measurement.RESULTS_DIR, f"{name}.json"), payload, finished)
    measurement.write_results(name, payload, args.output)
    return rows


def _updated(path, payload, finished):
    """The results file at `path` with the rows of the same case, mode and length replaced by
    `payload`'s, and `payload`'s config listed under `updates`."""
    with open(path) as file:
        old = json.load(file)
    new = {_point(row): row for row in payload["rows"]}
    rows = [new.pop(_point(row), row) for row in old["rows"]] + list(new.values())
    updates = old.get("updates", []) + [{"config": payload["config"], "run_finished_utc": finished}]
    return {"config": old["config"], "updates": updates, "rows": rows}


def _point(row):
    return row["case"], row["mode"], row["length"]


def _measure(case, mode, length, args):
    row = {"case": case, "mode": mode, "length": length}
    if case == "dense_causal" and length > args.dense_max_length:
        return {**row, "status": f"not run (dense causal only up to --dense-max-length {args.dense_max_length})"}
    repeats = 1 if length >= args.single_call_from else args.repeats
    command = [
        "-m",
        "benchmarks.sparse_patterns",
        "--child",
        "--case",
        case,
        "--mode",
        mode,
        "--length",
        str(length),
        "--heads",
        str(args.heads),
        "--depth",
        str(args.depth),
        "--stride",
        str(args.stride),
        "--repeats",
        str(repeats),
    ]
    result = measurement.run_watched_child(command, args.cap_gb)
    if result.get("status") == "ok":
        result["attention_gb"] = result["peak_rss_gb"] - result["baseline_rss_gb"]
    return {**row, **result}


def _add_ratios(rows):
    """Dense causal's time over each case's, at the same mode and length, where both ran."""
    dense = {(r["mode"], r["length"]): r for r in rows if r["case"] == "dense_causal" and r["status"] == "ok"}
    for row in rows:
        peer = dense.get((row["mode"], row["length"]))
        if row["case"] != "dense_causal" and row["status"] == "ok" and peer:
            row["speedup_vs_dense_causal"] = peer["seconds"] / row["seconds"]


if __name__ == "__main__":
    main(sys.argv[1:])
