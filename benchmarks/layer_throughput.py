"""Attention layer throughput, forward + backward, compiled: keras_attn vs keras.layers.MultiHeadAttention.

One run measures a grid: every `--policies` (Keras dtype policy: `float32`, `mixed_bfloat16`),
every `--causal` setting (1: causal self-attention, 0: full), every length (batch = `--tokens //
length`, at least 1). In each cell every layer of `--layers` runs one training step (forward,
`sum(y * y)`, gradients of the weights and the input) inside `tf.function`, for every
`--jit-compile` setting (0: without XLA, 1: `jit_compile=True`); the steps of a cell run in turn
`--repeats` times and each keeps its best wall time and its best CPU time (this process, all
threads), and each row carries its ratio to Keras at the same `jit_compile` setting and to
Keras's best setting, both measured in the same cell, and the ratio of CPU times at the same
setting: on a shared machine other processes stretch a step's wall time, its CPU time far
less.

Throughput follows FlashAttention's convention: the FLOPs of the four projections and of the
`Q K^T` and `P V` products, the attention half counted under a causal mask (the half a causal
kernel has to compute), times three for the backward pass, whatever an implementation skips or
recomputes (`dense_work_flops` counts the full matrix too, in the JSON). The matmul peak is a
compiled `1024 x 1024 x 1024` matmul in the policy's compute dtype (float32, or bfloat16 under
`mixed_bfloat16`), run in turn with the layers of every cell, so each share of it compares like
with like.

    python -m benchmarks.layer_throughput                  # the grid: L 512/1024/2048, causal and not, float32 and mixed_bfloat16, with and without XLA
    python -m benchmarks.layer_throughput --lengths 512 --causal 1 --policies float32 --jit-compile 0   # the target case
    python -m benchmarks.layer_throughput --layers keras dense chunked blockwise auto --lengths 512   # every path
"""

import sys

import keras  # noqa: E402  (after measurement sets the backend)
import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from keras_attn.layers.multi_head_attention import MultiHeadAttention  # noqa: E402

PEER_RATIO = (
    "speedup_vs_keras_same_jit"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
)
GOAL_FIELDS = (
    "cpu_speedup_vs_keras_same_jit",
    "fraction_of_matmul_peak",
)  # shown beside the ratio in `make bench`'s table (benchmarks/run_all.py)
GOALS = (("speedup_vs_keras_same_jit", ">=", 2.0, {"layer": "auto", "causal": True}),)  # benchmarks/page.py
LENGTH_PLOT = (("layer", "causal", "policy", "jit_compile"), ("ms_per_step",))
BENCH_ARGS = ["--repeats", "3"]  # `make bench` (benchmarks/run_all.py): the whole grid, fewer repeats

DEFAULT_LENGTHS = (512, 1024, 2048)
LAYERS = ("keras", "dense", "chunked", "blockwise", "auto")  # "keras": the peer; "auto": keras_attn's default layer
POLICIES = ("float32", "mixed_bfloat16")  # the CPU has avx512_bf16: bfloat16 is its fast half precision


def projection_flops(batch, length, width):
    """Forward FLOPs of the query, key, value and output projections."""
    return 4 * 2 * batch * length * width * width


def attention_flops(batch, length, width, causal):
    """Forward FLOPs of `Q K^T` and `P V` over all heads; half of them under a causal mask."""
    full = 2 * 2 * batch * length * length * width
    return full // 2 if causal else full


def training_flops(batch, length, width, causal):
    """Forward + backward FLOPs on FlashAttention's convention (the causal half counted)."""
    return 3 * (projection_flops(batch, length, width) + attention_flops(batch, length, width, causal))


def dense_work_flops(batch, length, width):
    """Forward + backward FLOPs counted as dense work: projections and the full attention matrix."""
    return training_flops(batch, length, width, causal=False)


def make_layer(name, num_heads, key_dim):
    """The layer called `name` in `LAYERS`: Keras's, or keras_attn's on that `implementation=`."""
    if name == "keras":
        return keras.layers.MultiHeadAttention(num_heads, key_dim)
    return MultiHeadAttention(num_heads, key_dim, implementation=name)


def training_step(layer, inputs, causal, jit_compile):
    """A compiled forward + backward step of `layer` on `inputs`."""
    layer(inputs, inputs, use_causal_mask=causal)

    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x, use_causal_mask=causal)
            loss = tf.reduce_sum(tf.cast(y, "float32") ** 2)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    return lambda: step(inputs)


def measure_cell(policy, causal, length, args):
    """The rows of one cell of the grid: every layer and `jit_compile` setting, in turn with the matmul peak."""
    batch = max(1, args.tokens // length)
    inputs = tf.random.normal((batch, length, args.width))
    keras.mixed_precision.set_global_policy(policy)
    matmul, matmul_flops = measurement.matmul_step(
        256 if args.smoke else 1024, keras.mixed_precision.global_policy().compute_dtype
    )
    steps = {("matmul peak", None): matmul}
    steps |= {
        (name, bool(jit)): training_step(
            make_layer(name, args.heads, args.width // args.heads), inputs, causal, bool(jit)
        )
        for name in args.layers
        for jit in args.jit_compile
    }
    cpu = {}
    best = measurement.best_seconds_round_robin(steps, args.repeats, cpu_seconds=cpu)
    peak = matmul_flops / best.pop(("matmul peak", None)) / 1e9
    flops = training_flops(batch, length, args.width, causal)
    rows = [
        {
            "policy": policy,
            "causal": causal,
            "length": length,
            "batch": batch,
            "layer": name,
            "jit_compile": jit,
            "ms_per_step": seconds * 1e3,
            "cpu_ms_per_step": cpu[name, jit] * 1e3,
            "tokens_per_s": batch * length / seconds,
            "gflops": flops / seconds / 1e9,
            "dense_work_gflops": dense_work_flops(batch, length, args.width) / seconds / 1e9,
            "matmul_peak_gflops": peak,
            "fraction_of_matmul_peak": flops / seconds / 1e9 / peak,
        }
        for (name, jit), seconds in best.items()
    ]
    keras_rows = {row["jit_compile"]: row for row in rows if row["layer"] == "keras"}
    for row in rows:
        peer = keras_rows.get(row["jit_compile"])
        row["speedup_vs_keras_same_jit"] = peer["ms_per_step"] / row["ms_per_step"] if peer else None
        row["cpu_speedup_vs_keras_same_jit"] = peer["cpu_ms_per_step"] / row["cpu_ms_per_step"] if peer else None
        keras_best = min((peer["ms_per_step"] for peer in keras_rows.values()), default=None)
        row["speedup_vs_keras_best"] = keras_best / row["ms_per_step"] if keras_best else None
        print(
            f"  {policy} causal={causal} {length} x{batch} {row['layer']} jit={row['jit_compile']}: {row['ms_per_step']:.1f} ms",
            flush=True,
        )
    return rows


COLUMNS = [
    ("policy", "policy", "{}"),
    ("causal", "causal", "{}"),
    ("length", "length", "{}"),
    ("batch", "batch", "{}"),
    ("layer", "layer", "{}"),
    ("jit_compile", "jit", "{}"),
    ("ms_per_step", "ms/step", "{:.1f}"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
    ("gflops", "GFLOP/s", "{:.1f}"),
    ("matmul_peak_gflops", "matmul peak", "{:.0f}"),
    ("fraction_of_matmul_peak", "of peak", "{:.0%}"),
    ("speedup_vs_keras_same_jit", "x keras same jit", "{:.2f}"),
    ("speedup_vs_keras_best", "x keras best", "{:.2f}"),
    ("cpu_ms_per_step", "CPU ms/step", "{:.1f}"),
    ("cpu_speedup_vs_keras_same_jit", "x keras CPU", "{:.2f}"),
]


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="+", default=list(DEFAULT_LENGTHS)),
        tokens=dict(type=int, default=8192, help="tokens per step; batch = tokens // length"),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        repeats=dict(type=int, default=5),
        causal=dict(type=int, nargs="+", choices=(0, 1), default=[1, 0], help="1: causal self-attention, 0: full"),
        policies=dict(nargs="+", choices=POLICIES, default=list(POLICIES), help="Keras dtype policies"),
        jit_compile=dict(type=int, nargs="+", choices=(0, 1), default=[0, 1], help="jit_compile settings to run"),
        layers=dict(nargs="+", choices=LAYERS, default=["keras", "auto"], help="layers to run (keras: the peer)"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.tokens, args.width, args.heads, args.repeats = [16], 32, 16, 2, 1
        args.causal, args.jit_compile, args.layers = [1], [0], ["keras", "auto"]
    previous_policy = keras.mixed_precision.global_policy()
    try:
        rows = [
            row
            for policy in args.policies
            for causal in args.causal
            for length in args.lengths
            for row in measure_cell(policy, bool(causal), length, args)
        ]
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    measurement.print_table(rows, COLUMNS)
    config = {k: v for k, v in vars(args).items() if k != "output"}
    measurement.write_results(
        "layer_throughput" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
