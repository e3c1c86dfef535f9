"""The kernel-level cost of a packed row: one row of `documents` documents (segment ids), attention that skips
the blocks across documents, against dense attention over the whole row and against the documents run alone.

One row of `length` tokens holds `documents` documents of `length / documents` tokens each. A
forward + backward step (gradients of query, key and value, compiled with `tf.function`, with XLA
under `--jit-compile`) of `scaled_dot_product_attention(..., segment_ids=..., implementation="blockwise")`
is timed against, in the same run (round robin, best of `repeats`):

- the dense kernel over the whole row with the same segment ids (it materialises the document mask
  and computes every pair): `dense_over_packed`, the issue's goal >= 5;
- the documents run separately, as a batch of `documents` rows of `length / documents` tokens, on the
  faster of the dense and blockwise kernels: `packed_over_separate`, the issue's goal <= 1.2.

Without a pattern and with `Causal()` (causal within each document). Each ratio is given in wall
time and in CPU time of this process (`*_cpu`): on shared cores other processes stretch the wall
time of whichever step they happen to overlap, the work a step costs far less.

    python -m benchmarks.packed_attention [--repeats N] [--jit-compile]
"""

import numpy as np
import tensorflow as tf

from benchmarks import measurement
from keras_attn import scaled_dot_product_attention
from keras_attn.patterns import Causal

PEER_RATIO = "dense_over_packed"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = ("packed_over_separate", "dense_over_packed_cpu", "packed_over_separate_cpu")
BENCH_ARGS = ["--repeats", "3"]  # `make bench` (benchmarks/run_all.py): fewer repeats
PATTERNS = {"none": None, "causal": Causal()}
COLUMNS = [  # the printed table: (row key, header, format)
    ("pattern", "pattern", "{}"),
    ("compiled", "compiled", "{}"),
    ("length", "length", "{}"),
    ("documents", "documents", "{}"),
    ("packed_ms", "packed ms", "{:.1f}"),
    ("dense_row_ms", "dense row ms", "{:.1f}"),
    ("separate_dense_ms", "separate dense ms", "{:.1f}"),
    ("separate_blockwise_ms", "separate blockwise ms", "{:.1f}"),
    ("dense_over_packed", "dense / packed", "{:.2f}"),
    ("packed_over_separate", "packed / separate", "{:.2f}"),
    ("dense_over_packed_cpu", "dense / packed (CPU time)", "{:.2f}"),
    ("packed_over_separate_cpu", "packed / separate (CPU time)", "{:.2f}"),
]


def packed_segment_ids(length, documents):
    """Int32 `(1, length)`: documents `1..documents` of `length // documents` tokens each."""
    return np.repeat(np.arange(1, documents + 1, dtype=np.int32), length // documents)[None, :]


def train_step(inputs, jit_compile, **attention):
    """A compiled forward + backward step: the gradients of query, key and value."""

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(scaled_dot_product_attention(*inputs, **attention))
        return tape.gradient(loss, inputs)

    return step


def measure(length, documents, heads, depth, repeats, jit_compile=False):
    if length % documents:
        raise ValueError(
            f"`length` must be a multiple of `documents`. Received: length={length}, documents={documents}"
        )
    row = [tf.random.normal((1, length, heads, depth)) for _ in range(3)]
    separate = [tf.reshape(tensor, (documents, length // documents, heads, depth)) for tensor in row]
    segment_ids = packed_segment_ids(length, documents)
    rows = []
    for name, pattern in PATTERNS.items():
        cpu = {}
        best = measurement.best_seconds_round_robin(
            {
                "packed": train_step(
                    row, jit_compile, pattern=pattern, segment_ids=segment_ids, implementation="blockwise"
                ),
                "dense_row": train_step(
                    row, jit_compile, pattern=pattern, segment_ids=segment_ids, implementation="dense"
                ),
                "separate_dense": train_step(separate, jit_compile, pattern=pattern, implementation="dense"),
                "separate_blockwise": train_step(separate, jit_compile, pattern=pattern, implementation="blockwise"),
            },
            repeats,
            cpu_seconds=cpu,
        )
        rows.append(
            {
                "pattern": name,
                "mode": "forward_backward",
                "compiled": "xla" if jit_compile else "graph",
                "length": length,
                "documents": documents,
                **{f"{step}_ms": 1e3 * seconds for step, seconds in best.items()},
                **_ratios(best),
                **{f"{step}_cpu_ms": 1e3 * seconds for step, seconds in cpu.items()},
                **{f"{ratio}_cpu": value for ratio, value in _ratios(cpu).items()},
            }
        )
    return rows


def _ratios(seconds):
    """The goals' ratios of `{step: seconds}`: dense over the row against packed, packed against
    the documents run separately on the faster of the dense and blockwise kernels."""
    separate = min(seconds["separate_dense"], seconds["separate_blockwise"])
    return {
        "dense_over_packed": seconds["dense_row"] / seconds["packed"],
        "packed_over_separate": seconds["packed"] / separate,
    }


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        length=dict(type=int, default=4096),
        documents=dict(type=int, default=8),
        heads=dict(type=int, default=4),
        depth=dict(type=int, default=64),
        repeats=dict(type=int, default=5),
        jit_compile=dict(action="store_true", help="compile every step with XLA (default: a tf.function graph)"),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.length, args.documents, args.heads, args.depth, args.repeats = 64, 4, 2, 8, 1
    rows = measure(args.length, args.documents, args.heads, args.depth, args.repeats, args.jit_compile)
    measurement.print_table(rows, COLUMNS)
    measurement.write_results(
        "packed_attention_smoke" if args.smoke else "packed_attention",
        {"config": vars(args), "rows": rows},
        args.output,
    )
    return rows


if __name__ == "__main__":
    main()
