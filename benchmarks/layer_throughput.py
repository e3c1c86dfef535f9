"""Attention layer throughput, forward + backward, compiled: keras_attn vs keras.layers.MultiHeadAttention.

For each length the batch is `--tokens // length` (at least 1). Every layer runs one training
step (forward, `sum(y * y)`, gradients of the weights and the input) inside `tf.function`, with
and without `jit_compile`; the layers run in turn `--repeats` times and each keeps its best
time. Throughput is reported as dense-work GFLOP/s: the FLOPs of the four projections and of
the full (unmasked) `Q K^T` and `P V` products, times three for the backward pass, whatever
the implementation skips. The float32 matmul peak (a 1024 x 1024 x 1024 matmul) runs in turn
with the layers at every length, so each fraction of it compares like with like.

    python -m benchmarks.layer_throughput                 # lengths 128..4096, causal
    python -m benchmarks.layer_throughput --lengths 512 --tokens 8192   # the target case
"""

import sys

from benchmarks import measurement

import keras  # noqa: E402  (after measurement sets the backend)
import tensorflow as tf  # noqa: E402

from keras_attn.layers.multi_head_attention import MultiHeadAttention  # noqa: E402

PEER_RATIO = "speedup_vs_keras_best"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)


def dense_work_flops(batch, length, width):
    """Forward + backward FLOPs counted as dense work: projections and the full attention matrix."""
    projections = 4 * 2 * batch * length * width * width
    attention = 2 * 2 * batch * length * length * width
    return 3 * (projections + attention)


def layers(num_heads, key_dim, causal):
    """The layers under test, by name: the peer first, then each keras_attn path and "auto"."""
    paths = ("dense", "chunked", "blockwise") if causal else ("dense", "blockwise")
    candidates = {"keras": lambda: keras.layers.MultiHeadAttention(num_heads, key_dim)}
    for path in paths:
        candidates[f"keras_attn {path}"] = lambda path=path: MultiHeadAttention(num_heads, key_dim, implementation=path)
    candidates["keras_attn auto"] = lambda: MultiHeadAttention(num_heads, key_dim)
    return candidates


def training_step(layer, inputs, causal, jit_compile):
    """A compiled forward + backward step of `layer` on `inputs`."""
    layer(inputs, inputs, use_causal_mask=causal)

    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x, use_causal_mask=causal)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    return lambda: step(inputs)


def measure_length(length, args):
    batch = max(1, args.tokens // length)
    inputs = tf.random.normal((batch, length, args.width))
    flops = dense_work_flops(batch, length, args.width)
    matmul, matmul_flops = measurement.matmul_step(256 if args.smoke else 1024)
    steps = {("matmul peak", None): matmul}
    steps |= {
        (name, bool(jit_compile)): training_step(make_layer(), inputs, bool(args.causal), bool(jit_compile))
        for name, make_layer in layers(args.heads, args.width // args.heads, args.causal).items()
        for jit_compile in args.jit_compile
    }
    best = measurement.best_seconds_round_robin(steps, args.repeats)
    peak = matmul_flops / best.pop(("matmul peak", None)) / 1e9
    rows = [
        {
            "length": length,
            "batch": batch,
            "layer": name,
            "jit_compile": jit_compile,
            "ms_per_step": seconds * 1e3,
            "tokens_per_s": batch * length / seconds,
            "gflops": flops / seconds / 1e9,
            "matmul_peak_gflops": peak,
            "fraction_of_matmul_peak": flops / seconds / 1e9 / peak,
        }
        for (name, jit_compile), seconds in best.items()
    ]
    keras_best = min(row["ms_per_step"] for row in rows if row["layer"] == "keras")
    for row in rows:
        row["speedup_vs_keras_best"] = keras_best / row["ms_per_step"]
        print(f"  {row['length']} x{row['batch']} {row['layer']} jit={row['jit_compile']}: {row['ms_per_step']:.1f} ms", flush=True)
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="+", default=list(DEFAULT_LENGTHS)),
        tokens=dict(type=int, default=8192, help="tokens per step; batch = tokens // length"),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        repeats=dict(type=int, default=5),
        causal=dict(type=int, default=1, help="1: causal self-attention (default), 0: full"),
        jit_compile=dict(type=int, nargs="+", default=[0, 1], help="jit_compile settings to run"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.tokens, args.width, args.heads, args.repeats = [16], 32, 16, 2, 1
        args.jit_compile = [0]
    rows = []
    for length in args.lengths:
        rows.extend(measure_length(length, args))
    measurement.print_table(
        rows,
        [
            ("length", "length", "{}"),
            ("batch", "batch", "{}"),
            ("layer", "layer", "{}"),
            ("jit_compile", "jit", "{}"),
            ("ms_per_step", "ms/step", "{:.1f}"),
            ("tokens_per_s", "tokens/s", "{:.0f}"),
            ("gflops", "GFLOP/s", "{:.1f}"),
            ("matmul_peak_gflops", "matmul peak", "{:.0f}"),
            ("fraction_of_matmul_peak", "of peak", "{:.0%}"),
            ("speedup_vs_keras_best", "x keras best", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k != "output"}
    measurement.write_results(
        "layer_throughput" + ("_smoke" if args.smoke else ""),
        {"config": config, "rows": rows},
        args.output,
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
