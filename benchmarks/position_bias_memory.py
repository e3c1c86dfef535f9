"""Peak process memory and time of long causal blockwise attention with a position bias vs without.

Batch 1, width 256, 8 heads, causal, `implementation="blockwise"`; the same
`keras_attn.MultiHeadAttention` with `position_bias=ALiBi(8)` (or T5's
`RelativePositionBias(8, bidirectional=False)`) and with no bias, forward and forward + backward
(gradients of the weights, the table included, and of the input) inside `tf.function`. Each
(bias, mode) runs in a fresh subprocess that reports its peak resident set size and the wall
time of its one call (`benchmarks.measurement.run_watched_child` /
`report_causal_self_attention_call`, as `benchmarks.memory_scaling`); the ratios are to the no-bias run at the same mode and length.

    python -m benchmarks.position_bias_memory
    python -m benchmarks.position_bias_memory --biases none alibi t5 --length 16384
"""

import argparse
import json
import sys

from benchmarks import measurement

PEER_RATIO = "memory_vs_no_bias"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = [
    "--length",
    "16384",
    "--modes",
    "forward_backward",
]  # `make bench` (benchmarks/run_all.py): fwd+bwd at 16,384 (the target's 65,536 is too long for `make bench`'s budget: the script's defaults)

BIASES = ("none", "alibi", "t5")
MODES = ("forward", "forward_backward")


def _position_bias(name, heads):
    from keras_attn import ALiBi
    from keras_attn import RelativePositionBias

    return {"none": None, "alibi": ALiBi(heads), "t5": RelativePositionBias(heads, bidirectional=False)}[name]


def run_child(bias_name, mode, length, width, heads):
    """In the child: builds the layer, traces, runs one step; prints a JSON line."""
    from keras_attn import MultiHeadAttention

    baseline = measurement.peak_rss_gb()
    layer = MultiHeadAttention(
        heads, width // heads, implementation="blockwise", position_bias=_position_bias(bias_name, heads)
    )
    measurement.report_causal_self_attention_call(layer, mode, length, width, baseline)


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        length=dict(type=int, default=65536),
        biases=dict(nargs="*", choices=BIASES, default=["none", "alibi"]),
        modes=dict(nargs="*", choices=MODES, default=list(MODES)),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        cap_gb=dict(type=float, default=8.0, help="kill a child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        bias=dict(choices=BIASES, help=argparse.SUPPRESS),
        mode=dict(choices=MODES, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.bias, args.mode, args.length, args.width, args.heads)
    if args.smoke:
        args.length, args.width, args.heads = 64, 16, 2
    rows = []
    for mode in args.modes:
        for bias_name in args.biases:
            arguments = [
                "-m",
                "benchmarks.position_bias_memory",
                "--child",
                "--bias",
                bias_name,
                "--mode",
                mode,
                "--length",
                str(args.length),
                "--width",
                str(args.width),
                "--heads",
                str(args.heads),
            ]
            row = {"bias": bias_name, "mode": mode, "length": args.length}
            row.update(measurement.run_watched_child(arguments, args.cap_gb))
            rows.append(row)
            print(json.dumps(row), flush=True)
    _add_ratios(rows)
    measurement.print_table(
        rows,
        [
            ("mode", "mode", "{}"),
            ("length", "length", "{}"),
            ("bias", "bias", "{}"),
            ("status", "status", "{}"),
            ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
            ("baseline_rss_gb", "baseline GB", "{:.2f}"),
            ("seconds", "seconds", "{:.2f}"),
            ("memory_vs_no_bias", "mem / no bias", "{:.2f}"),
            ("time_vs_no_bias", "time / no bias", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "bias", "mode")}
    name = "position_bias_memory" + ("_smoke" if args.smoke else "")
    measurement.write_results(name, {"config": config, "rows": rows}, args.output)
    return rows


def _add_ratios(rows):
    """Each biased run's memory and time over the no-bias run's at the same mode, where both ran."""
    peers = {r["mode"]: r for r in rows if r["bias"] == "none" and r["status"] == "ok"}
    for row in rows:
        peer = peers.get(row["mode"])
        if row["bias"] != "none" and row["status"] == "ok" and peer:
            row["memory_vs_no_bias"] = row["peak_rss_gb"] / peer["peak_rss_gb"]
            row["time_vs_no_bias"] = row["seconds"] / peer["seconds"]


if __name__ == "__main__":
    main(sys.argv[1:])
