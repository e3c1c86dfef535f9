"""Peak memory of keras_attn's dense attention against `keras.layers.MultiHeadAttention`, per call variant.

The dense kernel materialises the `(batch, heads, query_len, key_len)` weights as Keras's layer does;
it must hold no more of them (issue #43: "never heavier than Keras"). Each variant is one
forward + backward self-attention step (gradients of the input and of every weight, inside
`tf.function`) of both layers with the same weights, batch `--tokens // length`:

- `plain`: no mask, no dropout;
- `dropout`: attention dropout 0.1, `training=True`;
- `padding`: a `value_mask` whose last quarter is padding;
- `causal`: `use_causal_mask=True` with dropout 0.1 (Keras's fused causal path takes no dropout);
- `bias`: an additive `(batch, 1, length, length)` bias for keras_attn; Keras's layer takes no
  bias, its peer is the same call with the equivalent boolean `attention_mask`;
- `mixed`: `mixed_float16` with dropout 0.1 (keras_attn's logits and softmax stay float32).

Each (layer, variant, length) runs in a fresh process (`measurement.first_run_peak`: `step_gb`, the
step's peak over the memory before it); `memory_vs_keras` is keras_attn's over Keras's in the same run.
keras_attn's layer runs the kernel `--implementation` names: `dense` by default (the claim above),
`auto` for what a user gets without choosing.

    python -m benchmarks.dense_memory                      # 512, 2,048 and 4,096 tokens
    python -m benchmarks.dense_memory --lengths 512 --variants plain dropout
    python -m benchmarks.dense_memory --implementation auto --variants mixed
"""

import argparse
import json
import sys

from benchmarks import measurement

PEER_RATIO = "memory_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
LENGTH_PLOT = (("layer", "variant"), ("step_gb",))  # benchmarks/page.py
SUMMARY = (
    ("variant",),
    "length",
    ("memory_vs_keras",),
    {"layer": "keras_attn"},
)  # the page's table: Keras's step_gb is plotted
LAYERS = ("keras", "keras_attn")
VARIANTS = ("plain", "dropout", "padding", "causal", "bias", "mixed")
DROPOUT = 0.1


def _layer(name, variant, heads, width, implementation):
    import keras

    from keras_attn.layers.multi_head_attention import MultiHeadAttention

    dropout = 0.0 if variant in ("plain", "padding", "bias") else DROPOUT
    if name == "keras":
        return keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout, seed=0)
    return MultiHeadAttention(heads, width // heads, dropout=dropout, seed=0, implementation=implementation)


def _call(name, variant, layer):
    """The layer's call on `x (batch, length, width)` for the variant, its masks built from `x`'s length."""
    import tensorflow as tf

    def real(x):  # (length,): the last quarter is padding
        length = tf.shape(x)[1]
        return tf.range(length) < length - length // 4

    if variant == "padding":
        return lambda x: layer(x, x, value_mask=tf.broadcast_to(real(x), tf.shape(x)[:2]), training=True)
    if variant == "causal":
        return lambda x: layer(x, x, use_causal_mask=True, training=True)
    if variant == "bias" and name == "keras":
        return lambda x: layer(x, x, attention_mask=_allowed(real(x), tf.shape(x)[0]), training=True)
    if variant == "bias":
        return lambda x: layer(x, x, attention_bias=_masking_bias(_allowed(real(x), tf.shape(x)[0])), training=True)
    return lambda x: layer(x, x, training=True)


def _allowed(real, batch):
    """`(batch, length, length)` boolean: every query may attend the `real` keys."""
    import tensorflow as tf

    length = tf.shape(real)[0]
    return tf.broadcast_to(real, (batch, length, length))


def _masking_bias(allowed):
    """`(batch, 1, length, length)` float32: 0 where `allowed`, the `-1e9` masking bias elsewhere."""
    import tensorflow as tf

    return tf.where(allowed, 0.0, -1e9)[:, None]


def run_child(args):
    """In the child: one forward + backward step of one layer and variant; prints a JSON line."""
    import keras
    import tensorflow as tf

    if args.variant == "mixed":
        keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    layer = _layer(args.layer, args.variant, args.heads, args.width, args.implementation)
    call = _call(args.layer, args.variant, layer)
    inputs = tf.random.stateless_normal((max(1, args.tokens // args.length), args.length, args.width), seed=(0, 0))
    call(inputs[:, :8])  # builds the weights (a full-size eager call would leave its memory to the step)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(tf.square(tf.cast(call(inputs), "float32")))
        return tape.gradient(loss, [inputs] + layer.trainable_variables)

    step.get_concrete_function()
    print(json.dumps(measurement.first_run_peak(step)))


def measure(layer, variant, length, args):
    arguments = ["-m", "benchmarks.dense_memory", "--child", "--layer", layer, "--variant", variant]
    arguments += [f"--length={length}", f"--tokens={args.tokens}", f"--width={args.width}", f"--heads={args.heads}"]
    arguments += [f"--implementation={args.implementation}"]
    result = measurement.run_watched_child(arguments, args.cap_gb)
    return {"variant": variant, "length": length, "layer": layer, **result}


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="*", default=[512, 2048, 4096]),
        variants=dict(nargs="+", choices=VARIANTS, default=list(VARIANTS)),
        tokens=dict(type=int, default=4096, help="tokens per step; batch = tokens // length"),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        implementation=dict(default="dense", help="keras_attn's kernel (the layer's `implementation`)"),
        cap_gb=dict(type=float, default=10.0, help="kill a child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        layer=dict(choices=LAYERS, help=argparse.SUPPRESS),
        variant=dict(choices=VARIANTS, help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.smoke:
        args.lengths, args.tokens, args.width, args.heads = [32], 64, 16, 2
    rows = []
    for variant in args.variants:
        for length in args.lengths:
            pair = [measure(layer, variant, length, args) for layer in LAYERS]
            if all(row["status"] == "ok" for row in pair):
                pair[1][PEER_RATIO] = pair[1]["step_gb"] / pair[0]["step_gb"]
            rows.extend(pair)
            print(json.dumps(pair[1]), flush=True)
    measurement.print_table(
        rows,
        [
            ("variant", "variant", "{}"),
            ("length", "length", "{}"),
            ("layer", "layer", "{}"),
            ("status", "status", "{}"),
            ("step_gb", "step GB", "{:.3f}"),
            (PEER_RATIO, "memory / keras", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "layer", "variant", "length")}
    measurement.write_results(
        "dense_memory" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
