"""Existing Keras and KerasHub models before and after `keras_attn.convert`, and under `keras_attn.enable()`.

The models, as users have them: the four keras.io Transformers (`models.keras_io_examples`: the
text classifier, the English-to-Spanish translator, the timeseries classifier (attention dropout
0.25) and the ViT (attention dropout 0.1), their published sizes, attention inside custom layers or
functional models; the ViT takes `round(sqrt(length))**2` patches and, past its published 144, a
head of its classifier layer only: the published flattened head `[2048, 1024]` would hold
gigabytes of weights at thousands of patches) and KerasHub's `DistilBertBackbone` and
`BertBackbone` (their default dropout 0.1), `GPT2Backbone`, `OPTBackbone`, `LlamaBackbone` and
`MistralBackbone` (grouped-query heads) and `GemmaBackbone` (one key/value head) built from
constructor arguments at a realistic width (`--width 768 --heads 12`, a feed-forward 4x wide) but
`--layers 2` and a vocabulary of `--vocabulary 1000`, to keep a 2-core CPU run sane; the causal LMs
with dropout 0. Each model runs in three variants with the same weights:

- `keras`: as built (the peer of every ratio);
- `converted`: `keras_attn.convert(model, strict=False)` (`--implementation` names its kernel; `auto` by default);
- `flash`: as built, its step traced under `keras_attn.enable()` (Keras's own flash switch routed
  to keras_attn's streaming kernel); only where Keras's layers call `keras.ops.dot_product_attention`
  (KerasHub's Llama, Mistral and Gemma attention does not on TensorFlow, and Keras's layer with
  attention dropout applies it outside the op, so not in training: no row).

`dot_product_attention` is Keras's op alone (after a projection, so that the step has weights):
`keras` and `flash` only.

A training step is the forward pass, a loss (the mean square of the outputs) and the gradients of
every weight inside `tf.function`; the variants run in turn `--repeats` times at each of
`--time-lengths` and keep their best time. Peak memory: each (model, variant) at each of
`--memory-lengths` runs one step in a fresh process (`measurement.first_run_peak`: `step_gb`, the
step's peak over the memory before it). Batch = `--tokens // length` (at least 1). With
`--generate`, each causal LM of `--generate-models` (`GPT2CausalLM`, ..., greedy, batch 1) generates
`--new-tokens` (64) after a `--prompt` (128) tokens long, compiled as KerasHub compiles it by default
and, with `--jit-compile`, also with `jit_compile=True`: tokens/s of each variant and whether the
tokens are identical to the unconverted model's. Each row is run twice, in separate invocations
(`--trial 1`, `--trial 2`, recorded in the rows): the page shows both, and a goal counts every row
of both, so its range is the two runs' band.

    python -m benchmarks.convert_models           # the full run: every model, time at 512, 2,048 and 4,096,
                                                  # memory at 512, 2,048 and 4,096, generation
    python -m benchmarks.convert_models --models gpt2 --time-lengths 2048 --memory-lengths 4096
    python -m benchmarks.convert_models --models timeseries distilbert --time-lengths 512 \
        --memory-lengths 512 --tokens 512 --repeats 1 --layers 1 --width 256 --heads 4   # tiny

Goals (`GOALS`, issue #52): the converted model no slower and no heavier than Keras's at every length,
at 4,096 tokens at most 0.3x its memory and 0.7x its step time; generation at least as fast, the
same tokens.
"""

import argparse
import json
import sys

import keras  # noqa: E402  (after measurement sets the backend)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_attn  # noqa: E402
from benchmarks import measurement
from models import keras_io_examples

PEER_RATIO = "time_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
GOAL_FIELDS = ("memory_vs_keras", "tokens_identical")
RATIO_PLOT = ("model", "length")  # the page's plot: per model, its ratios at each length
SUMMARY = (
    ("model", "trial"),
    "length",
    ("time_vs_keras", "memory_vs_keras", "tokens_identical"),
    {"variant": "converted"},
)
GOALS = (  # (row key, comparison, bound, where): benchmarks/page.py
    ("time_vs_keras", "<=", 1.0, {"variant": "converted", "length": 512}),
    ("time_vs_keras", "<=", 1.0, {"variant": "converted", "length": 2048}),
    ("time_vs_keras", "<=", 0.7, {"variant": "converted", "length": 4096}),
    ("memory_vs_keras", "<=", 1.0, {"variant": "converted", "length": 512}),
    ("memory_vs_keras", "<=", 1.0, {"variant": "converted", "length": 2048}),
    ("memory_vs_keras", "<=", 0.3, {"variant": "converted", "length": 4096}),
    (  # generation: tokens/s at least Keras's (the time per token at most)
        "time_vs_keras",
        "<=",
        1.0,
        {
            "variant": "converted",
            "model": [
                "gpt2 generate",
                "gpt2 generate jit",
                "opt generate",
                "opt generate jit",
                "llama generate",
                "llama generate jit",
                "gemma generate",
                "gemma generate jit",
            ],
        },
    ),
    ("tokens_identical", "==", True, {"variant": "converted"}),
)
# `make bench`: Keras's op, one keras.io model and GPT-2, time at 2,048 tokens, memory at 4,096, generation;
# the full run is the script's defaults (see the docstring).
BENCH_ARGS = [
    "--models",
    "dot_product_attention",
    "text_classifier",
    "gpt2",
    "--time-lengths",
    "2048",
    "--memory-lengths",
    "4096",
    "--tokens",
    "2048",
    "--repeats",
    "1",
    "--generate",
    "--generate-models",
    "gpt2",
    "--jit-compile",
]

VARIANTS = ("keras", "converted", "flash")
# KerasHub's Llama, Mistral and Gemma attention calls `keras.ops.dot_product_attention` only on JAX
# and PyTorch (`fused_attention_op_available`): on TensorFlow Keras's flash switch never reaches it.
# Keras's layer with attention dropout applies it outside the op: in training the switch never
# reaches the models built with it either.
NO_FLASH_PATH = ("llama", "mistral", "gemma", "timeseries", "vit", "distilbert", "bert", "opt")
CAUSAL_LMS = {
    "gpt2": "GPT2CausalLM",
    "opt": "OPTCausalLM",
    "llama": "LlamaCausalLM",
    "mistral": "MistralCausalLM",
    "gemma": "GemmaCausalLM",
}


def _keras_hub():
    import keras_hub

    return keras_hub


def _backbone_inputs(batch, length, vocabulary, segment_ids=False):
    rng = np.random.default_rng(length)
    inputs = {
        "token_ids": tf.constant(rng.integers(1, vocabulary, (batch, length)), "int32"),
        "padding_mask": tf.ones((batch, length), "bool"),
    }
    if segment_ids:
        inputs["segment_ids"] = tf.zeros((batch, length), "int32")
    return inputs


def text_classifier(length, args):
    model = keras_io_examples.text_classifier(maxlen=length)
    return model, lambda batch: tf.constant(np.random.default_rng(length).integers(1, 20000, (batch, length)))


def translator(length, args):
    model = keras_io_examples.english_to_spanish_translator(sequence_length=length)

    def inputs(batch):
        rng = np.random.default_rng(length)
        return [tf.constant(rng.integers(1, 15000, (batch, length)), "int64") for _ in range(2)]

    return model, inputs


def timeseries(length, args):
    model = keras_io_examples.timeseries_transformer(input_shape=(length, 1))
    return model, lambda batch: tf.random.stateless_normal((batch, length, 1), seed=(0, length))


def vit(length, args):
    side = max(1, round(length**0.5))
    published = side * side <= 144
    model = keras_io_examples.vision_transformer(image_size=6 * side, mlp_head_units=(2048, 1024) if published else ())
    return model, lambda batch: tf.random.stateless_uniform((batch, 6 * side, 6 * side, 3), seed=(0, length))


def _bert_like_arguments(args, dropout):
    """BERT's, DistilBERT's, GPT-2's and OPT's shared constructor arguments: the width, heads, layers,
    a 4x feed-forward, `dropout`."""
    return dict(
        vocabulary_size=args.vocabulary,
        num_layers=args.layers,
        num_heads=args.heads,
        hidden_dim=args.width,
        intermediate_dim=4 * args.width,
        dropout=dropout,
    )


def bert(length, args):
    model = _keras_hub().models.BertBackbone(**_bert_like_arguments(args, 0.1), max_sequence_length=length)
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary, segment_ids=True)


def distilbert(length, args):
    model = _keras_hub().models.DistilBertBackbone(**_bert_like_arguments(args, 0.1), max_sequence_length=length)
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def gpt2(length, args):
    model = _keras_hub().models.GPT2Backbone(
        **_bert_like_arguments(args, 0.0), max_sequence_length=max(length, args.prompt + args.new_tokens)
    )
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def opt(length, args):
    model = _keras_hub().models.OPTBackbone(
        **_bert_like_arguments(args, 0.0), max_sequence_length=max(length, args.prompt + args.new_tokens)
    )
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def _grouped_query_arguments(args):
    """Llama's and Mistral's shared constructor arguments: a third as many key/value heads, a 4x feed-forward."""
    return dict(
        vocabulary_size=args.vocabulary,
        num_layers=args.layers,
        num_query_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 3),
        hidden_dim=args.width,
        intermediate_dim=4 * args.width,
    )


def llama(length, args):
    model = _keras_hub().models.LlamaBackbone(**_grouped_query_arguments(args))
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def mistral(length, args):
    window = max(length, args.prompt + args.new_tokens)  # Mistral 7B's 4,096: the whole row here
    model = _keras_hub().models.MistralBackbone(**_grouped_query_arguments(args), sliding_window=window)
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def gemma(length, args):
    model = _keras_hub().models.GemmaBackbone(
        vocabulary_size=args.vocabulary,
        num_layers=args.layers,
        num_query_heads=args.heads,
        num_key_value_heads=1,
        hidden_dim=args.width,
        intermediate_dim=8 * args.width,  # Gemma halves it across its gated pair
        head_dim=args.width // args.heads,
    )
    return model, lambda batch: _backbone_inputs(batch, length, args.vocabulary)


def attention_op(length, args):
    """Keras's op alone (`keras.ops.dot_product_attention`, causal) after one `Dense` projection,
    `--heads` heads of the `--width`: what the switch changes, without the rest of a model."""
    depth = args.width // args.heads
    features = keras.Input((length, args.width))
    heads = keras.layers.Reshape((length, args.heads, depth))(keras.layers.Dense(args.width)(features))
    attended = keras.layers.Lambda(lambda t: keras.ops.dot_product_attention(t, t, t, is_causal=True))(heads)
    model = keras.Model(features, attended)
    return model, lambda batch: tf.random.stateless_normal((batch, length, args.width), seed=(0, length))


MODELS = {
    "dot_product_attention": attention_op,
    "text_classifier": text_classifier,
    "translator": translator,
    "timeseries": timeseries,
    "vit": vit,
    "distilbert": distilbert,
    "bert": bert,
    "gpt2": gpt2,
    "opt": opt,
    "llama": llama,
    "mistral": mistral,
    "gemma": gemma,
}


def variants_of(name, args):
    skipped = {"flash": NO_FLASH_PATH, "converted": ("dot_product_attention",)}  # the op holds no layer to convert
    return [variant for variant in args.variants if name not in skipped.get(variant, ())]


def build(name, length, args):
    """The model (seeded: every build has the same weights) and its inputs for a batch size."""
    keras.utils.set_random_seed(0)
    return MODELS[name](length, args)


def variant_model(name, variant, length, args):
    """`(model, inputs, status)` of one variant; `status` says what convert did or why it could not."""
    model, inputs = build(name, length, args)
    if variant != "converted":
        return model, inputs, "ok"
    model, report = keras_attn.convert(model, implementation=args.implementation, strict=False, return_report=True)
    if report.unconverted:
        return model, inputs, f"{len(report.unconverted)} attention layer(s) not converted: {report.unconverted[0][1]}"
    return model, inputs, "ok" if report.converted or report.adapted else "convert found no attention layer"


def training_step(model, inputs):
    """A compiled forward pass, the mean square of the float outputs, and the gradients of every weight."""

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outputs = tf.nest.flatten(model(inputs, training=True))
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, "float32"))) for o in outputs])
        return tape.gradient(loss, model.trainable_variables)

    return step


def under_switch(variant, function):
    """`function()` with Keras's flash switch routed to keras_attn for the `flash` variant only."""
    if variant != "flash":
        return function()
    keras_attn.enable()
    try:
        return function()
    finally:
        keras_attn.disable()


def traced_step(variant, model, inputs):
    step = training_step(model, inputs)
    under_switch(variant, step.get_concrete_function)  # the switch is read when the step is traced
    return step


def output_difference(model, peer, variant, inputs):
    """Max |output - peer's output| on `inputs` (inference)."""
    ours = under_switch(variant, lambda: tf.nest.flatten(model(inputs)))
    theirs = tf.nest.flatten(peer(inputs))
    return max(
        float(tf.reduce_max(tf.abs(tf.cast(a, "float32") - tf.cast(b, "float32")))) for a, b in zip(ours, theirs)
    )


def run_child(args):
    """In the child: one training step of one variant of one model at `--length`; prints a JSON line."""
    model, inputs, status = variant_model(args.model, args.variant, args.length, args)
    if status != "ok":
        print(json.dumps({"convert_status": status}))
        return
    step = traced_step(args.variant, model, inputs(max(1, args.tokens // args.length)))
    print(json.dumps(measurement.first_run_peak(step)))


def _base_row(name, length, args, variant):
    return {
        "model": name,
        "trial": args.trial,
        "length": length,
        "batch": max(1, args.tokens // length),
        "variant": variant,
    }


def time_rows(name, length, args):
    """One row per variant: best step time in turn with the others, output difference to `keras`."""
    built = {variant: variant_model(name, variant, length, args) for variant in variants_of(name, args)}
    peer = built["keras"][0]
    rows, steps = [], {}
    for variant, (model, inputs, status) in built.items():
        row = {**_base_row(name, length, args, variant), "convert_status": status}
        if status == "ok":
            batch_inputs = inputs(row["batch"])
            row["max_output_difference"] = output_difference(model, peer, variant, batch_inputs)
            steps[variant] = traced_step(variant, model, batch_inputs)
        rows.append(row)
    best = measurement.best_seconds_round_robin(steps, args.repeats)
    for row in rows:
        if row["variant"] in best:
            row["ms_per_step"] = best[row["variant"]] * 1e3
            row[PEER_RATIO] = best[row["variant"]] / best["keras"]
        print(f"  {name} {length} {row['variant']}: {json.dumps(row)}", flush=True)
    return rows


def memory_rows(name, length, args):
    """One row per variant: its step's peak memory in a fresh process, and the ratio to `keras`'s."""
    rows = []
    for variant in variants_of(name, args):
        arguments = ["-m", "benchmarks.convert_models", "--child", "--model", name, "--variant", variant]
        arguments += ["--length", str(length), f"--tokens={args.tokens}"]
        flags = ("width", "heads", "layers", "vocabulary", "implementation")
        arguments += [f"--{flag}={getattr(args, flag)}" for flag in flags]
        memory = measurement.run_watched_child(arguments, args.cap_gb)
        row = {**_base_row(name, length, args, variant), "memory_status": memory.pop("status"), **memory}
        rows.append(row)
        print(f"  {name} {length} {variant} memory: {json.dumps(memory)}", flush=True)
    keras_row = rows[0]
    for row in rows[1:]:
        if row.get("step_gb") and keras_row.get("step_gb"):
            row["memory_vs_keras"] = row["step_gb"] / keras_row["step_gb"]
    return rows


def generation_rows(args):
    """Greedy generation of each causal LM of `--generate-models`, per compile mode: tokens/s per
    variant and whether its tokens are the `keras` variant's."""
    rows = []
    for name in args.generate_models:
        for jit_compile in (False, True) if args.jit_compile else (False,):
            rows.extend(_generation_rows(name, jit_compile, args))
    return rows


def _generation_rows(name, jit_compile, args):
    keras_hub = _keras_hub()
    rng = np.random.default_rng(0)
    total = args.prompt + args.new_tokens
    token_ids = np.zeros((1, total), "int32")
    token_ids[:, : args.prompt] = rng.integers(1, args.vocabulary, (1, args.prompt))
    prompt = {"token_ids": token_ids, "padding_mask": np.arange(total)[None, :] < args.prompt}
    label = f"{name} generate" + (" jit" if jit_compile else "")
    rows, generators, tokens = [], {}, {}
    for variant in variants_of(name, args):
        backbone, _, status = variant_model(name, variant, total, args)
        row = {**_base_row(label, total, args, variant), "batch": 1, "convert_status": status}
        rows.append(row)
        if status != "ok":
            continue
        lm = getattr(keras_hub.models, CAUSAL_LMS[name])(backbone=backbone, preprocessor=None)
        lm.compile(sampler="greedy", **({"jit_compile": True} if jit_compile else {}))  # else KerasHub's default

        def generate(lm=lm, variant=variant):
            return under_switch(variant, lambda: lm.generate(prompt, stop_token_ids=None)["token_ids"])

        tokens[variant] = generate()  # compiles the generation function
        generators[variant] = generate
    seconds = measurement.best_seconds_round_robin(generators, args.repeats, warmup=0)
    for row in rows:
        variant = row["variant"]
        if variant in seconds:
            row["new_tokens_per_s"] = args.new_tokens / seconds[variant]
            row[PEER_RATIO] = seconds[variant] / seconds["keras"]
            row["tokens_identical"] = bool(np.array_equal(tokens[variant], tokens["keras"]))
        print(f"  {label} {variant}: {json.dumps(row)}", flush=True)
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        models=dict(nargs="+", choices=tuple(MODELS), default=list(MODELS)),
        variants=dict(nargs="+", choices=VARIANTS, default=list(VARIANTS)),
        time_lengths=dict(type=int, nargs="*", default=[512, 2048, 4096]),
        memory_lengths=dict(type=int, nargs="*", default=[512, 2048, 4096]),
        tokens=dict(type=int, default=4096, help="tokens per step; batch = tokens // length"),
        width=dict(type=int, default=768),
        heads=dict(type=int, default=12),
        layers=dict(type=int, default=2),
        vocabulary=dict(type=int, default=1000),
        repeats=dict(type=int, default=2),
        trial=dict(type=int, default=1, help="which run of the same rows this is (each row is run twice)"),
        implementation=dict(default="auto", help="the converted variant's kernel (convert's `implementation`)"),
        generate=dict(action="store_true", help="also greedy generation of --generate-models"),
        generate_models=dict(nargs="+", choices=tuple(CAUSAL_LMS), default=list(CAUSAL_LMS)),
        jit_compile=dict(action="store_true", help="generation also with jit_compile=True"),
        prompt=dict(type=int, default=128),
        new_tokens=dict(type=int, default=64),
        cap_gb=dict(type=float, default=12.0, help="kill a memory child above this RSS (GB)"),
        child=dict(action="store_true", help=argparse.SUPPRESS),
        model=dict(choices=tuple(MODELS), help=argparse.SUPPRESS),
        variant=dict(choices=VARIANTS, help=argparse.SUPPRESS),
        length=dict(type=int, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.time_lengths, args.memory_lengths, args.tokens = ["gpt2"], [16], [16], 32
        args.width, args.heads, args.layers, args.vocabulary, args.repeats = 16, 2, 1, 50, 1
        args.generate, args.generate_models, args.prompt, args.new_tokens = True, ["gpt2"], 4, 4
    if args.child:
        return run_child(args)
    rows = []
    for name in args.models:
        for length in args.time_lengths:
            rows.extend(time_rows(name, length, args))
        for length in args.memory_lengths:
            rows.extend(memory_rows(name, length, args))
    if args.generate:
        rows.extend(generation_rows(args))
    measurement.print_table(
        rows,
        [
            ("model", "model", "{}"),
            ("length", "length", "{}"),
            ("batch", "batch", "{}"),
            ("variant", "variant", "{}"),
            ("ms_per_step", "ms/step", "{:.0f}"),
            ("time_vs_keras", "time / keras", "{:.2f}"),
            ("step_gb", "step GB", "{:.3f}"),
            ("memory_vs_keras", "memory / keras", "{:.2f}"),
            ("new_tokens_per_s", "tokens/s", "{:.1f}"),
            ("tokens_identical", "same tokens", "{}"),
            ("max_output_difference", "max |diff|", "{:.1e}"),
            ("convert_status", "convert", "{}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "child", "model", "variant", "length")}
    measurement.write_results(
        "convert_models" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
