"""Training step of a model built from Keras's own layers, before and after `keras_attn.convert`.

The model: `Embedding` + `--blocks` pre-norm encoder blocks (`LayerNormalization`,
`keras.layers.MultiHeadAttention` with `use_causal_mask=True`, a `Dense` feed-forward) + a `Dense`
head, as a user already has it. `keras_attn.convert(model, implementation=...)` gives the copy
with the same weights (the run checks that its outputs match). A training step is the
forward pass, a cross-entropy loss and the gradients of every weight inside `tf.function`; both
models run in turn `--repeats` times at each length and keep their best time. Peak memory:
each (model, length) runs in a fresh subprocess: the step is traced, the peak resident set size
is reset, and the step's first run's peak is read (`step_gb`: that peak over the RSS before it).
Batch = `--tokens // length` (at least 1).

    python -m benchmarks.convert_speed                      # lengths 512 and 4096
    python -m benchmarks.convert_speed --lengths 512 --tokens 8192 --implementation blockwise
"""

import argparse
import json
import sys

import keras  # noqa: E402  (after measurement sets the backend)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_attn  # noqa: E402
from benchmarks import measurement
from keras_attn.dispatch.attention import ATTENTION_IMPLEMENTATIONS  # noqa: E402

PEER_RATIO = "time_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)

MODELS = ("keras", "converted")


def keras_model(vocabulary, width, heads, blocks):
    """A causal language model made of Keras's own layers only."""
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, width)(tokens)
    for index in range(blocks):
        h = keras.layers.LayerNormalization(name=f"block{index}_attention_norm")(x)
        h = keras.layers.MultiHeadAttention(heads, width // heads, name=f"block{index}_attention")(
            h, h, use_causal_mask=True
        )
        x = keras.layers.Add()([x, h])
        h = keras.layers.LayerNormalization(name=f"block{index}_ffn_norm")(x)
        h = keras.layers.Dense(4 * width, activation="gelu", name=f"block{index}_up")(h)
        x = keras.layers.Add()([x, keras.layers.Dense(width, name=f"block{index}_down")(h)])
    return keras.Model(tokens, keras.layers.Dense(vocabulary, name="logits")(x))


def models(args):
    """`{"keras": the model, "converted": the same model built again, same weights, convert()ed}`
    (`convert` changes a model in place)."""
    keras.utils.set_random_seed(0)
    model = keras_model(args.vocabulary, args.width, args.heads, args.blocks)
    twin = keras_model(args.vocabulary, args.width, args.heads, args.blocks)
    twin.set_weights(model.get_weights())
    return {"keras": model, "converted": keras_attn.convert(twin, implementation=args.implementation)}


def training_step(model, tokens):
    """A compiled forward + loss + gradients of every weight, on `tokens` (next-token targets)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))
        return tape.gradient(loss, model.trainable_variables)

    return step


def sample_tokens(batch, length, vocabulary):
    return tf.constant(np.random.default_rng(length).integers(0, vocabulary, (batch, length + 1)), "int32")


def run_child(args):
    """In the child: one training step of one model at one length; prints a JSON line.

    The step is traced first, then measured by `measurement.first_run_peak`.
    """
    model = models(args)[args.model]
    tokens = sample_tokens(max(1, args.tokens // args.length), args.length, args.vocabulary)
    step = training_step(model, tokens)
    step.get_concrete_function()
    print(json.dumps(measurement.first_run_peak(step)))


def measure_length(length, args):
    """Best step time of both models at `length` (same process, in turn), then each one's peak memory (fresh processes)."""
    batch = max(1, args.tokens // length)
    tokens = sample_tokens(batch, length, args.vocabulary)
    candidates = models(args)
    probe = tokens[:, :-1]
    difference = float(tf.reduce_max(tf.abs(candidates["converted"](probe) - candidates["keras"](probe))))
    best = measurement.best_seconds_round_robin(
        {name: training_step(m, tokens) for name, m in candidates.items()}, args.repeats
    )
    rows = []
    for name in MODELS:
        arguments = [
            "-m",
            "benchmarks.convert_speed",
            "--child",
            "--model",
            name,
            "--length",
            str(length),
            *(
                f"--{flag}={getattr(args, flag)}"
                for flag in ("tokens", "width", "heads", "blocks", "vocabulary", "implementation")
            ),
        ]
        memory = measurement.run_watched_child(arguments, args.cap_gb)
        rows.append(
            {
                "length": length,
                "batch": batch,
                "model": name,
                "ms_per_step": best[name] * 1e3,
                "tokens_per_s": batch * length / best[name],
                "max_output_difference": difference,
                "memory_status": memory["status"],
                "peak_rss_gb": memory.get("peak_rss_gb"),
                "step_gb": memory.get("step_gb"),
                "rss_before_step_gb": memory.get("rss_before_step_gb"),
            }
        )
        print(f"  {length} x{batch} {name}: {best[name] * 1e3:.1f} ms, {json.dumps(memory)}", flush=True)
    keras_row, converted_row = rows
    converted_row["time_vs_keras"] = converted_row["ms_per_step"] / keras_row["ms_per_step"]
    if keras_row["memory_status"] == converted_row["memory_status"] == "ok":
        converted_row["peak_rss_vs_keras"] = converted_row["peak_rss_gb"] / keras_row["peak_rss_gb"]
        if keras_row["step_gb"] > 0:  # tiny steps (--smoke) grow nothing measurable
            converted_row["step_memory_vs_keras"] = converted_row["step_gb"] / keras_row["step_gb"]
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        lengths=dict(type=int, nargs="+", default=[512, 4096]),
        tokens=dict(type=int, default=4096, help="tokens per step; batch = tokens // length"),
        width=dict(type=int, default=128),
        heads=dict(type=int, default=4),
        blocks=dict(type=int, default=2),
        vocabulary=dict(type=int, default=1000),
        implementation=dict(choices=ATTENTION_IMPLEMENTATIONS, default="auto"),
        repeats=dict(type=int, default=3),
        cap_gb=dict(type=float, default=20.0, help="kill a memory child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        model=dict(choices=MODELS, help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.tokens, args.width, args.heads, args.blocks, args.vocabulary, args.repeats = (
            [16],
            32,
            16,
            2,
            1,
            50,
            1,
        )
    if args.child:
        return run_child(args)
    rows = []
    for length in args.lengths:
        rows.extend(measure_length(length, args))
    measurement.print_table(
        rows,
        [
            ("length", "length", "{}"),
            ("batch", "batch", "{}"),
            ("model", "model", "{}"),
            ("ms_per_step", "ms/step", "{:.1f}"),
            ("tokens_per_s", "tokens/s", "{:.0f}"),
            ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
            ("rss_before_step_gb", "RSS before GB", "{:.2f}"),
            ("step_gb", "step GB", "{:.3f}"),
            ("time_vs_keras", "time / keras", "{:.2f}"),
            ("peak_rss_vs_keras", "peak / keras", "{:.2f}"),
            ("step_memory_vs_keras", "step mem / keras", "{:.2f}"),
            ("max_output_difference", "max |diff|", "{:.1e}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "model", "length")}
    measurement.write_results(
        "convert_speed" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
