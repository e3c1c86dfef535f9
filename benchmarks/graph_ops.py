"""The ops a converted model's graph holds beside the original's: a training step and a decoding step, compared.

Wall-clock ratios on a shared machine are noisy; the traced graphs are not. For each model this
traces, with `tf.function(...).get_concrete_function`, the same step of the model as built
(`keras`) and after `keras_attn.convert` (`converted`), same weights, and prints the op types whose
counts differ (ours minus Keras's) and the tensors the training step keeps for its backward pass:

- `train`: the forward pass with `training=True` (KerasHub BERT's dropout 0.1 active), the mean
  square of the outputs and the gradients of every weight, at `--length` tokens;
- `decode`: one step of KerasHub's cached generation, `CausalLM.call_with_cache` on one new token
  per row against a cache of `--length` positions (what `generate` runs once per new token),
  outside XLA; `decode_xla` the same step traced with `jit_compile=True` (its ops before XLA's
  fusion).

`layer` is `keras.layers.MultiHeadAttention` alone (self-attention, dropout 0.1, no mask), and
`layer_padded` the same layer with a padding `attention_mask`; the others are KerasHub backbones
(BERT, GPT-2, OPT, Llama, Gemma, Qwen3) built from constructor arguments at `--width`, `--heads`
and `--layers`. The counts include the bodies of the functions the graph calls. Kept tensors are
the forward tensors the gradient ops read (`gradient_tape/...`), with their bytes at the traced
(static) shapes. Ops, not seconds: the output is the same on every run of the same versions.

    python -m benchmarks.graph_ops                       # every model, 128 tokens
    python -m benchmarks.graph_ops --models bert gemma --length 512
"""

import argparse
import collections
import json

import keras
import numpy as np
import tensorflow as tf

import keras_attn
from benchmarks import convert_models

MODELS = ("layer", "layer_padded", "bert", "gpt2", "opt", "llama", "gemma", "qwen3")
CAUSAL_LMS = {**convert_models.CAUSAL_LMS, "qwen3": "Qwen3CausalLM"}
GRADIENT_SCOPE = "gradient_tape/"  # the name scope of the ops `tf.GradientTape.gradient` adds


def op_counts(concrete):
    """`Counter` of op types in `concrete`'s graph and in the functions its library holds."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return collections.Counter(node.op for node in nodes)


def kept_for_backward(concrete):
    """`(count, bytes)` of the forward tensors the backward pass reads (static shapes; unknown sizes count 0).

    The backward ops are those created from the first `gradient_tape/` op on (a graph lists its ops
    in creation order), which includes the gradient functions of `custom_gradient`s, named outside
    that scope; the forward ops are those created before. A tensor an identity passes on is counted
    once, as the tensor it is.
    """
    operations = concrete.graph.get_operations()
    first = next(i for i, operation in enumerate(operations) if operation.name.startswith(GRADIENT_SCOPE))
    forward = {operation.name for operation in operations[:first]}
    kept = {}
    for operation in operations[first:]:
        for tensor in operation.inputs:
            tensor = _aliased(tensor)
            producer = tensor.op
            if producer.name in forward and producer.type not in ("Const", "Placeholder", "ReadVariableOp"):
                kept[tensor.name] = tensor
    total = 0
    for tensor in kept.values():
        shape = tensor.shape
        if shape.rank is not None and shape.is_fully_defined() and tensor.dtype.is_numpy_compatible:
            total += int(np.prod(shape.as_list())) * tensor.dtype.size
    return len(kept), total


def _aliased(tensor):
    """The tensor whose buffer `tensor` is: through identities (`custom_gradient`'s `IdentityN`), which copy nothing."""
    while tensor.op.type in ("Identity", "IdentityN"):
        tensor = tensor.op.inputs[tensor.value_index]
    return tensor


def difference(ours, theirs):
    """`{op: ours - theirs}` for the op types whose counts differ."""
    return {op: ours[op] - theirs[op] for op in sorted(set(ours) | set(theirs)) if ours[op] != theirs[op]}


def _keras_hub():
    import keras_hub

    return keras_hub


def _backbone(name, args):
    hub = _keras_hub().models
    common = dict(vocabulary_size=args.vocabulary, num_layers=args.layers, hidden_dim=args.width)
    bert_like = dict(common, num_heads=args.heads, intermediate_dim=4 * args.width)
    length = args.length + 1
    if name == "bert":
        return hub.BertBackbone(**bert_like, dropout=0.1, max_sequence_length=length)
    if name == "gpt2":
        return hub.GPT2Backbone(**bert_like, dropout=0.0, max_sequence_length=length)
    if name == "opt":
        return hub.OPTBackbone(**bert_like, dropout=0.0, max_sequence_length=length)
    grouped = dict(common, num_query_heads=args.heads, intermediate_dim=4 * args.width)
    if name == "llama":
        return hub.LlamaBackbone(**grouped, num_key_value_heads=max(1, args.heads // 2))
    if name == "gemma":
        return hub.GemmaBackbone(**grouped, num_key_value_heads=1, head_dim=args.width // args.heads)
    if name == "qwen3":
        return hub.Qwen3Backbone(
            **grouped, num_key_value_heads=max(1, args.heads // 2), head_dim=args.width // args.heads
        )
    raise ValueError(f"Unknown model. Received: name={name!r}")


def _layer(name, args):
    """Keras's layer called on `(batch, length, width)` features (with a padding mask for `layer_padded`)."""
    layer = keras.layers.MultiHeadAttention(args.heads, args.width // args.heads, dropout=0.1)
    features = keras.Input((args.length, args.width), batch_size=args.batch)
    if name == "layer_padded":
        padding = keras.Input((args.length,), batch_size=args.batch, dtype="bool")
        mask = keras.ops.logical_and(padding[:, None, :], padding[:, :, None])
        model = keras.Model([features, padding], layer(features, features, attention_mask=mask))
        real = np.arange(args.length)[None, :] < np.array([[args.length], [args.length // 2]])[: args.batch]
        return model, [tf.random.stateless_normal((args.batch, args.length, args.width), (0, 1)), tf.constant(real)]
    model = keras.Model(features, layer(features, features))
    return model, tf.random.stateless_normal((args.batch, args.length, args.width), (0, 1))


def build(name, args):
    """`(model, inputs)`: seeded, so the two variants have the same weights."""
    keras.utils.set_random_seed(0)
    if name.startswith("layer"):
        return _layer(name, args)
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": tf.constant(rng.integers(1, args.vocabulary, (args.batch, args.length)), "int32"),
        "padding_mask": tf.ones((args.batch, args.length), "bool"),
    }
    if name == "bert":
        inputs["segment_ids"] = tf.zeros((args.batch, args.length), "int32")
    return _backbone(name, args), inputs


def training_graph(model, inputs):
    """The traced training step of `benchmarks.convert_models` (forward, mean-square loss, every gradient)."""
    return convert_models.training_step(model, inputs).get_concrete_function()


def decoding_graph(backbone, name, args, jit_compile=False):
    """One cached step of KerasHub's generation: `call_with_cache` on one token per row."""
    lm = getattr(_keras_hub().models, CAUSAL_LMS[name])(backbone=backbone, preprocessor=None)
    prompt = tf.ones((args.batch, args.length), "int32")
    _, cache = lm._build_cache(prompt)

    @tf.function(jit_compile=jit_compile)
    def step(token_ids, cache, index):
        return lm.call_with_cache(token_ids, cache, index)

    return step.get_concrete_function(
        tf.TensorSpec((args.batch, 1), "int32"), tf.TensorSpec(cache.shape, cache.dtype), tf.TensorSpec((), "int32")
    )


def _variants(name, args):
    """`{variant: (model, inputs)}`, `keras` then `converted`, the same weights."""
    original = build(name, args)
    converted_model, inputs = build(name, args)
    keras_attn.convert(converted_model)
    return {"keras": original, "converted": (converted_model, inputs)}


def compare(name, args):
    """The rows of one model: per step, the op counts' difference and the kept tensors of each variant."""
    variants = _variants(name, args)
    steps = {"train": lambda model, inputs: training_graph(model, inputs)}
    if name in CAUSAL_LMS:
        steps["decode"] = lambda model, inputs: decoding_graph(model, name, args)
        steps["decode_xla"] = lambda model, inputs: decoding_graph(model, name, args, jit_compile=True)
    rows = []
    for step, trace in steps.items():
        graphs = {variant: trace(model, inputs) for variant, (model, inputs) in variants.items()}
        counts = {variant: op_counts(graph) for variant, graph in graphs.items()}
        row = {
            "model": name,
            "step": step,
            "ops_keras": sum(counts["keras"].values()),
            "ops_converted": sum(counts["converted"].values()),
            "converted_minus_keras": difference(counts["converted"], counts["keras"]),
        }
        if step == "train":
            for variant, graph in graphs.items():
                row[f"kept_tensors_{variant}"], row[f"kept_bytes_{variant}"] = kept_for_backward(graph)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--vocabulary", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="one JSON line per row instead of text")
    args = parser.parse_args(argv)
    for name in args.models:
        for row in compare(name, args):
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            kept = ""
            if "kept_tensors_keras" in row:
                kept = (
                    f"; kept for backward: keras {row['kept_tensors_keras']} tensors {row['kept_bytes_keras']:,} B, "
                    f"converted {row['kept_tensors_converted']} tensors {row['kept_bytes_converted']:,} B"
                )
            print(f"{name} {row['step']}: ops keras {row['ops_keras']}, converted {row['ops_converted']}{kept}")
            print(f"    converted - keras: {row['converted_minus_keras']}", flush=True)


if __name__ == "__main__":
    main()
