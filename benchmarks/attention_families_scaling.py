"""Time and peak memory of each attention family vs length: LSH, Linformer, linear, FAVOR+, dense, blockwise.

Batch 1, width 256, 8 heads (key_dim 32); forward and forward + backward (gradients of the
weights and the input) inside `tf.function`, as `benchmarks/memory_scaling.py` does. Each (case,
mode, length) runs in a fresh subprocess that reports its peak resident set size, the RSS just
before the timed call (process, weights and input built, step traced: `baseline_rss_gb`), so
`call_gb = peak - baseline` is the call's own memory, and the wall time of its one call. The
parent kills a child over `--cap-gb` of RSS or `--max-seconds` and stops growing the length of
that case; a step is not started when it cannot fit: a dense one whose `(heads, seq, seq)`
float32 scores alone would pass the cap, or one whose time extrapolated from the previous
length (quadratic for dense and blockwise, linear for the others) passes `--max-seconds` (its
row says why).

Cases (non-causal unless named): `dense` and `blockwise` are `keras_attn.MultiHeadAttention`
with that `implementation`; `blockwise_causal` is its causal peer; `lsh` is
`LSHSelfAttention(num_buckets=32, num_hashes=2, chunk_size=64)` (a fixed bucket count: memory
linear in the length); `linformer` is `LinformerSelfAttention(projected_length=256)` with
`max_length` the length; `linear_elu`, `favor` and `linear_elu_causal` are `LinearAttention`.

    nice -n 10 python -m benchmarks.attention_families_scaling
    python -m benchmarks.attention_families_scaling --cases lsh linformer --lengths 1024 4096
"""

import argparse
import json
import sys

from benchmarks import measurement

PEER_RATIO = "time_vs_peer"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
LENGTH_PLOT = (("case", "mode"), ("seconds", "call_gb"))  # benchmarks/page.py
BENCH_ARGS = [
    "--lengths",
    "8192",
    "32768",
    "--modes",
    "forward_backward",
    "--cases",
    "blockwise",
    "lsh",
    "linformer",
    "linear_elu_causal",
]  # `make bench` (benchmarks/run_all.py): fwd+bwd at two lengths x4 apart (the targets' 65,536 is too long for `make bench`'s budget: the script's defaults)

LENGTHS = (1024, 4096, 16384, 65536)
CASES = ("dense", "blockwise", "blockwise_causal", "lsh", "linformer", "linear_elu", "favor", "linear_elu_causal")
# The families and peers; `blockwise_causal` (the causal peer) runs when asked with --cases.
DEFAULT_CASES = ("dense", "blockwise", "lsh", "linformer", "linear_elu", "favor", "linear_elu_causal")
MODES = ("forward", "forward_backward")
PEER = {"linear_elu_causal": "blockwise_causal"}  # the peer of the others: blockwise (non-causal)
# Copies of the (heads, seq, seq) float32 scores a dense call holds at its peak (logits, weights,
# and in the backward pass their gradient); a lower bound used to skip cases that cannot fit.
DENSE_SCORE_COPIES = {"forward": 2, "forward_backward": 3}
QUADRATIC = ("dense", "blockwise", "blockwise_causal")


def build_case(name, length, width, heads):
    """`(layer, call)`: the case's layer and `call(x)`, its self-attention over `x`."""
    from keras_attn import LinearAttention
    from keras_attn import LinformerSelfAttention
    from keras_attn import LSHSelfAttention
    from keras_attn import MultiHeadAttention

    key_dim = width // heads
    if name in ("dense", "blockwise", "blockwise_causal"):
        layer = MultiHeadAttention(heads, key_dim, implementation=name.split("_")[0])
        return layer, lambda x: layer(x, x, use_causal_mask=name == "blockwise_causal")
    if name == "lsh":
        layer = LSHSelfAttention(heads, key_dim, num_buckets=32, num_hashes=2, chunk_size=64, seed=0)
    elif name == "linformer":
        layer = LinformerSelfAttention(heads, key_dim, max_length=length, projected_length=256, seed=0)
    else:
        feature_map = "favor" if name == "favor" else "elu"
        layer = LinearAttention(heads, key_dim, feature_map=feature_map, causal=name.endswith("_causal"), seed=0)
    return layer, layer


def run_child(name, mode, length, width, heads):
    """In the child: builds the case, traces, runs one step; prints a JSON line."""
    import tensorflow as tf

    layer, call = build_case(name, length, width, heads)
    inputs = tf.random.normal((1, length, width), seed=0)
    seconds, baseline = measurement.time_one_step(layer, call, mode, inputs)
    peak = measurement.peak_rss_gb()
    print(
        json.dumps({"seconds": seconds, "peak_rss_gb": peak, "baseline_rss_gb": baseline, "call_gb": peak - baseline})
    )


def reason_not_to_run(name, mode, length, previous, args):
    """Why the step cannot fit (a sentence), or `None`; `previous` is the row of the last length run."""
    if name == "dense":
        scores_gb = DENSE_SCORE_COPIES[mode] * args.heads * length**2 * 4 / 2**30
        if scores_gb > args.cap_gb:
            return f"not run: its (heads, seq, seq) scores alone need {scores_gb:.1f} GB > cap {args.cap_gb:g} GB"
    if previous is not None and previous.get("seconds") is not None:
        power = 2 if name in QUADRATIC else 1
        predicted = previous["seconds"] * (length / previous["length"]) ** power
        if predicted > args.max_seconds:
            return (
                f"not run: {previous['seconds']:.0f} s at {previous['length']} extrapolates "
                f"(x length^{power}) to {predicted:.0f} s > {args.max_seconds:g} s"
            )
    return None


def measure(name, mode, length, previous, args):
    """Runs one child under the RSS and time watchdog (unless it cannot fit); returns a result row."""
    row = {"case": name, "mode": mode, "length": length}
    reason = reason_not_to_run(name, mode, length, previous, args)
    if reason:
        return {**row, "status": reason}
    arguments = [
        "-m",
        "benchmarks.attention_families_scaling",
        "--child",
        "--case",
        name,
        "--mode",
        mode,
        "--length",
        str(length),
        "--width",
        str(args.width),
        "--heads",
        str(args.heads),
    ]
    return {**row, **measurement.run_watched_child(arguments, args.cap_gb, args.max_seconds)}


def add_ratios(rows):
    """Each case's time and call memory over its peer's in this run (blockwise; causal blockwise for causal linear, if it ran)."""
    done = {(r["case"], r["mode"], r["length"]): r for r in rows if r["status"] == "ok"}
    for row in rows:
        key = (row["mode"], row["length"])
        peer = done.get((PEER.get(row["case"]), *key)) or done.get(("blockwise", *key))
        if row["status"] == "ok" and peer and peer is not row:
            row["peer"] = peer["case"]
            row["time_vs_peer"] = row["seconds"] / peer["seconds"]
            row["memory_vs_peer"] = row["call_gb"] / peer["call_gb"] if peer["call_gb"] > 0 else None


def growth(rows):
    """`{case/mode: call memory at the longest length / at the previous one}` where both ran (4.0: linear)."""
    out = {}
    for name in CASES:
        for mode in MODES:
            done = sorted(
                (r["length"], r["call_gb"]) for r in rows if (r["case"], r["mode"], r["status"]) == (name, mode, "ok")
            )
            if len(done) >= 2:
                (short, short_gb), (long, long_gb) = done[-2], done[-1]
                out[f"{name}/{mode}"] = {"lengths": [short, long], "memory_ratio": long_gb / short_gb}
    return out


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="*", default=list(LENGTHS)),
        cases=dict(nargs="*", choices=CASES, default=list(DEFAULT_CASES)),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        cap_gb=dict(type=float, default=8.0, help="kill a child above this RSS (GB)"),
        max_seconds=dict(type=float, default=300.0, help="kill a child running longer than this"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        modes=dict(nargs="*", choices=MODES, default=list(MODES)),
        case=dict(choices=CASES, help=argparse.SUPPRESS),
        mode=dict(choices=MODES, help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.case, args.mode, args.length, args.width, args.heads)
    if args.smoke:
        args.lengths, args.width, args.heads, args.modes = [32], 16, 2, ["forward_backward"]
        args.cases = ["blockwise", "lsh", "linformer", "favor", "linear_elu_causal"]
    rows = []
    for mode in args.modes:
        for name in args.cases:
            previous = None
            for length in args.lengths:
                row = measure(name, mode, length, previous, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["status"].startswith("over"):
                    break  # longer lengths will not fit either
                previous = row if row["status"] == "ok" else previous
    add_ratios(rows)
    measurement.print_table(
        rows,
        [
            ("mode", "mode", "{}"),
            ("length", "length", "{}"),
            ("case", "case", "{}"),
            ("status", "status", "{}"),
            ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
            ("call_gb", "call GB", "{:.2f}"),
            ("seconds", "seconds", "{:.2f}"),
            ("memory_vs_peer", "mem / peer", "{:.2f}"),
            ("time_vs_peer", "time / peer", "{:.2f}"),
            ("peer", "peer", "{}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "case", "mode", "length")}
    name = "attention_families_scaling" + ("_smoke" if args.smoke else "")
    measurement.write_results(name, {"config": config, "rows": rows, "memory_growth": growth(rows)}, args.output)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
