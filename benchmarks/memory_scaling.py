"""Peak process memory and time of causal self-attention vs length: keras_attn vs Keras.

Batch 1, width 256, 8 heads, causal; forward and forward + backward (gradients of the weights
and the input) inside `tf.function`. Each (layer, mode, length) runs in a fresh subprocess that
reports its peak resident set size (`resource.getrusage`) and the wall time of its one call
(traced beforehand; the first run's graph optimisation is included, for both layers alike); the
parent kills a child whose RSS passes `--cap-gb` (recorded as "over cap") and stops growing the
length of that layer.

    python -m benchmarks.memory_scaling
    python -m benchmarks.memory_scaling --forward-lengths 131072 --backward-lengths 32768
"""

import argparse
import json
import sys

from benchmarks import measurement

PEER_RATIO = "memory_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = ("peak_rss_gb",)  # shown beside the ratio on the benchmarks page (benchmarks/page.py)
GOALS = (  # peak process memory (GB) of our layer's causal self-attention at long lengths
    ("peak_rss_gb", "<=", 4.0, {"layer": "keras_attn", "mode": "forward", "length": 131072}),
    ("peak_rss_gb", "<=", 8.0, {"layer": "keras_attn", "mode": "forward_backward", "length": 32768}),
)
LENGTH_PLOT = (("layer", "mode"), ("seconds", "peak_rss_gb"))
BENCH_ARGS = [
    "--forward-lengths",
    "4096",
    "32768",
    "--backward-lengths",
    "4096",
    "16384",
]  # `make bench` (benchmarks/run_all.py): Keras's peer at 4,096 and one long length (the targets' 131,072 / 32,768: the script's defaults)

FORWARD_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
BACKWARD_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
LAYERS = ("keras", "keras_attn")


def run_child(layer_name, mode, length, width, heads):
    """In the child: builds the layer, traces, runs one step; prints a JSON line."""
    import keras

    from keras_attn.layers.multi_head_attention import MultiHeadAttention

    baseline = measurement.peak_rss_gb()
    if layer_name == "keras":
        layer = keras.layers.MultiHeadAttention(heads, width // heads)
    else:
        layer = MultiHeadAttention(heads, width // heads)
    measurement.report_causal_self_attention_call(layer, mode, length, width, baseline)


def measure(layer_name, mode, length, args):
    """Runs one child with an RSS watchdog; returns a result row."""
    arguments = [
        "-m",
        "benchmarks.memory_scaling",
        "--child",
        "--layer",
        layer_name,
        "--mode",
        mode,
        "--length",
        str(length),
        "--width",
        str(args.width),
        "--heads",
        str(args.heads),
    ]
    return {
        "layer": layer_name,
        "mode": mode,
        "length": length,
        **measurement.run_watched_child(arguments, args.cap_gb),
    }


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        forward_lengths=dict(type=int, nargs="*", default=list(FORWARD_LENGTHS)),
        backward_lengths=dict(type=int, nargs="*", default=list(BACKWARD_LENGTHS)),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        cap_gb=dict(type=float, default=10.0, help="kill a child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        layer=dict(choices=LAYERS, help=argparse.SUPPRESS),
        mode=dict(choices=("forward", "forward_backward"), help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args.layer, args.mode, args.length, args.width, args.heads)
    if args.smoke:
        args.forward_lengths, args.backward_lengths, args.width, args.heads = [32], [], 16, 2
    rows = []
    for mode, lengths in (("forward", args.forward_lengths), ("forward_backward", args.backward_lengths)):
        for layer_name in LAYERS:
            for length in lengths:
                row = measure(layer_name, mode, length, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["status"] != "ok":
                    break  # longer lengths will not fit either
    _add_ratios(rows)
    measurement.print_table(
        rows,
        [
            ("mode", "mode", "{}"),
            ("length", "length", "{}"),
            ("layer", "layer", "{}"),
            ("status", "status", "{}"),
            ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
            ("baseline_rss_gb", "baseline GB", "{:.2f}"),
            ("seconds", "seconds", "{:.2f}"),
            ("memory_vs_keras", "mem / keras", "{:.2f}"),
            ("time_vs_keras", "time / keras", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "layer", "mode", "length")}
    measurement.write_results(
        "memory_scaling" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


def _add_ratios(rows):
    """keras_attn's memory and time over Keras's at the same mode and length, where both ran."""
    keras_rows = {(r["mode"], r["length"]): r for r in rows if r["layer"] == "keras" and r["status"] == "ok"}
    for row in rows:
        peer = keras_rows.get((row["mode"], row["length"]))
        if row["layer"] == "keras_attn" and row["status"] == "ok" and peer:
            row["memory_vs_keras"] = row["peak_rss_gb"] / peer["peak_rss_gb"]
            row["time_vs_keras"] = row["seconds"] / peer["seconds"]


if __name__ == "__main__":
    main(sys.argv[1:])
