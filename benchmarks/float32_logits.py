"""The cost of float32 logits under mixed precision: Q·Kᵀ cast up first vs computed in float16.

keras_attn computes the logits of every kernel in float32 whatever the compute dtype (float16
products overflow at 65,504, see README's Reliability section). The peer is the previous behaviour,
measured in the same run: the same attention (scale, causal mask, float32 softmax, value product
in float16) with Q·Kᵀ computed in float16 and cast to float32 afterwards. Both are compiled
(`tf.function`), forward + backward, float16 inputs `(batch, length, heads, depth)`; the ratio
`float32_over_float16` is the time keras_attn pays for logits that cannot overflow.

    python -m benchmarks.float32_logits
"""

import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from keras_attn import scaled_dot_product_attention  # noqa: E402
from keras_attn.core.masks import causal_mask  # noqa: E402
from keras_attn.core.softmax import masked_softmax  # noqa: E402

PEER_RATIO = "float32_over_float16"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = ["--repeats", "5"]  # `make bench` (benchmarks/run_all.py): fewer repeats


def float16_logits_attention(query, key, value, scale):
    """The peer: logits in the inputs' float16, then the same float32 masked softmax."""
    logits = tf.einsum("bqhd,bkhd->bhqk", query * tf.cast(scale, query.dtype), key)  # float16
    mask = causal_mask(query.shape[1], key.shape[1])
    weights = masked_softmax(tf.cast(logits, tf.float32), mask)
    return tf.einsum("bhqk,bkhd->bqhd", tf.cast(weights, value.dtype), value)


def keras_attn_attention(query, key, value, scale):
    return scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, implementation="dense")


def train_step(attention, inputs, scale):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(tf.cast(attention(*inputs, scale), tf.float32))
        return tape.gradient(loss, inputs)

    return step


def measure(batch, lengths, heads, depth, repeats):
    rows = []
    for length in lengths:
        inputs = [tf.random.normal((batch, length, heads, depth), dtype=tf.float16) for _ in range(3)]
        scale = depth**-0.5
        best = measurement.best_seconds_round_robin(
            {
                "float32": train_step(keras_attn_attention, inputs, scale),
                "float16": train_step(float16_logits_attention, inputs, scale),
            },
            repeats,
        )
        rows.append(
            {
                "length": length,
                "float32_logits_ms": 1e3 * best["float32"],
                "float16_logits_ms": 1e3 * best["float16"],
                "float32_over_float16": best["float32"] / best["float16"],
            }
        )
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="+", default=[256, 512, 1024]),
        batch=dict(type=int, default=8),
        heads=dict(type=int, default=8),
        depth=dict(type=int, default=32),
        repeats=dict(type=int, default=10),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.batch, args.heads, args.depth, args.repeats = [16], 1, 2, 8, 2
    rows = measure(args.batch, args.lengths, args.heads, args.depth, args.repeats)
    measurement.print_table(
        rows,
        [
            ("length", "length", "{}"),
            ("float32_logits_ms", "float32 logits ms", "{:.1f}"),
            ("float16_logits_ms", "float16 logits ms", "{:.1f}"),
            ("float32_over_float16", "float32 / float16", "{:.2f}"),
        ],
    )
    measurement.write_results(
        "float32_logits_smoke" if args.smoke else "float32_logits",
        {"config": vars(args), "rows": rows},
        args.output,
    )
    return rows


if __name__ == "__main__":
    main()
