"""`keras_attn.convert` on KerasHub's models, built from their constructors (tiny sizes, random weights).

The oracle is the same model unconverted, with the same weights: outputs and gradients within
1e-5 on real tokens, greedy `generate` giving the same tokens through the cache. Each model keeps
its class; the report counts the layers converted (Keras's `MultiHeadAttention` and KerasHub's
`CachedMultiHeadAttention`) and adapted (Llama, Mistral, Gemma attention).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_attn
from tests.twin_models import max_difference
from tests.twin_models import twins

keras_hub = pytest.importorskip("keras_hub")

VOCABULARY, LENGTH, LAYERS = 64, 10, 2
TOLERANCE = 1e-5
# Gemma 2's options; a logit soft cap of 1 bites on the tiny model's logits (the unconverted twin caps them).
GEMMA2 = dict(
    query_head_dim_normalize=False,
    use_post_ffw_norm=True,
    use_post_attention_norm=True,
    attention_logit_soft_cap=1.0,
    final_logit_soft_cap=30.0,
    use_sliding_window_attention=True,
    sliding_window_size=3,
)


def _inputs(seed=0):
    """Two sequences, the second padded over its last three positions."""
    token_ids = np.random.default_rng(seed).integers(1, VOCABULARY, (2, LENGTH)).astype("int32")
    padding_mask = np.ones((2, LENGTH), bool)
    padding_mask[1, -3:] = False
    token_ids[~padding_mask] = 0
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def _backbone(name, **extra):
    """A tiny KerasHub backbone by constructor arguments (no preset is downloaded)."""
    common = dict(vocabulary_size=VOCABULARY, num_layers=LAYERS, hidden_dim=16, intermediate_dim=32)
    grouped = dict(num_query_heads=4, num_key_value_heads=2)
    models = keras_hub.models
    builders = {
        "bert": lambda: models.BertBackbone(num_heads=2, max_sequence_length=32, **common),
        "gpt2": lambda: models.GPT2Backbone(num_heads=2, max_sequence_length=32, **common, **extra),
        "llama": lambda: models.LlamaBackbone(**grouped, **common),
        "mistral": lambda: models.MistralBackbone(sliding_window=4, **grouped, **common),
        "gemma": lambda: models.GemmaBackbone(head_dim=8, **grouped, **common, **extra),
        "gemma2": lambda: models.GemmaBackbone(head_dim=8, **grouped, **common, **GEMMA2, **extra),
        "qwen": lambda: models.QwenBackbone(**grouped, **common, **extra),
    }
    return builders[name]()


def _backbone_inputs(name, seed=0):
    inputs = _inputs(seed)
    if name == "bert":
        inputs["segment_ids"] = np.zeros_like(inputs["token_ids"])
    return inputs


def _sequence_output(model, inputs):
    outputs = model(inputs)
    return outputs["sequence_output"] if isinstance(outputs, dict) else outputs


def _check_outputs_and_gradients(reference, model, inputs):
    """Outputs at the real tokens and the gradients of a loss over them, within `TOLERANCE`."""
    valid = inputs["padding_mask"]
    weights = np.random.default_rng(1).normal(size=(16,)).astype("float32")

    def run(m):
        with tf.GradientTape() as tape:
            output = _sequence_output(m, inputs)
            loss = tf.reduce_sum(tf.where(valid[..., None], output * weights, 0.0))
        return output, tape.gradient(loss, m.trainable_variables)

    (expected, expected_gradients), (got, got_gradients) = run(reference), run(model)
    output_difference = max_difference(ops.convert_to_numpy(got)[valid], ops.convert_to_numpy(expected)[valid])
    assert [g is None for g in got_gradients] == [e is None for e in expected_gradients]  # e.g. an unused pooler
    pairs = [
        (tf.convert_to_tensor(g), tf.convert_to_tensor(e))
        for g, e in zip(got_gradients, expected_gradients)
        if e is not None
    ]
    # Relative to each gradient's largest entry: a token embedding sums many positions' gradients.
    gradient_difference = max(max_difference(g, e) / max(1.0, float(np.max(np.abs(e)))) for g, e in pairs)
    assert output_difference < TOLERANCE and gradient_difference < TOLERANCE, (output_difference, gradient_difference)
    return output_difference, gradient_difference


@pytest.mark.parametrize(
    "name, converted, adapted",
    [
        ("bert", LAYERS, 0),
        ("gpt2", LAYERS, 0),
        ("llama", 0, LAYERS),
        ("mistral", 0, LAYERS),
        ("gemma", 0, LAYERS),
        ("gemma2", 0, LAYERS),
    ],
)
def test_backbones_outputs_and_gradients_equal_the_original(name, converted, adapted):
    reference, model = twins(lambda: _backbone(name))
    variables = [id(v) for v in model.weights]
    result, report = keras_attn.convert(model, return_report=True)

    assert result is model and type(model) is type(reference)
    assert [id(v) for v in model.weights] == variables
    assert (len(report.converted), len(report.adapted), report.unconverted) == (converted, adapted, ())
    assert all(path.startswith(f"{model.name}/") for path in report.converted + report.adapted)
    _check_outputs_and_gradients(reference, model, _backbone_inputs(name))
    assert keras_attn.convert(model, return_report=True)[1].already_ours == report.converted + report.adapted


def test_gemma_sliding_window_runs_as_the_core_op_window():
    reference, model = twins(lambda: _backbone("gemma", use_sliding_window_attention=True, sliding_window_size=3))
    report = keras_attn.convert(model, return_report=True)[1]
    assert len(report.adapted) == LAYERS
    _check_outputs_and_gradients(reference, model, _backbone_inputs("gemma"))


def test_qwen_sliding_window_runs_as_the_core_op_window():
    # Qwen windows in its hook (Llama's shape of hook), not in the mask its decoder builds.
    reference, model = twins(lambda: _backbone("qwen", use_sliding_window_attention=True, sliding_window_size=3))
    report = keras_attn.convert(model, return_report=True)[1]
    assert len(report.adapted) == LAYERS
    _check_outputs_and_gradients(reference, model, _backbone_inputs("qwen"))


def test_an_architecture_without_adapter_is_named():
    DFineMultiheadAttention = pytest.importorskip(
        "keras_hub.src.models.d_fine.d_fine_attention", reason="this keras-hub has no D-FINE"
    ).DFineMultiheadAttention

    inputs = keras.Input((LENGTH, 16))
    model = keras.Model(inputs, DFineMultiheadAttention(16, 2, name="detr")(inputs), name="detector")
    with pytest.raises(
        ValueError, match=r"detector/detr: no keras_attn adapter for KerasHub's DFineMultiheadAttention"
    ):
        keras_attn.convert(model)


# GPT-2 and Gemma 2 (soft caps, sliding windows) in `make test`; every architecture's greedy tokens
# are also held by tests/test_convert_keras_hub_registry.py.
@pytest.mark.parametrize(
    "name",
    ["gpt2", pytest.param("llama", marks=pytest.mark.slow), pytest.param("gemma", marks=pytest.mark.slow), "gemma2"],
)
def test_causal_lm_generates_the_same_tokens_and_trains(name):
    task = {
        "gpt2": keras_hub.models.GPT2CausalLM,
        "llama": keras_hub.models.LlamaCausalLM,
        "gemma": keras_hub.models.GemmaCausalLM,
        "gemma2": keras_hub.models.GemmaCausalLM,
    }[name]
    reference, model = twins(lambda: task(backbone=_backbone(name), preprocessor=None))
    model.compile(sampler="greedy")
    reference.compile(sampler="greedy")
    prompt = {"token_ids": np.zeros((2, LENGTH), "int32"), "padding_mask": np.zeros((2, LENGTH), bool)}
    prompt["token_ids"][:, :3] = np.random.default_rng(2).integers(1, VOCABULARY, (2, 3))
    prompt["padding_mask"][:, :3] = True
    expected = reference.generate(prompt, stop_token_ids=None)
    model.generate(prompt, stop_token_ids=None)  # traced before convert: must be traced again

    report = keras_attn.convert(model, return_report=True)[1]
    assert type(model) is task and len(report.converted + report.adapted) == LAYERS
    got = model.generate(prompt, stop_token_ids=None)
    np.testing.assert_array_equal(got["token_ids"], expected["token_ids"])
    assert bool(np.all(got["token_ids"][:, 3:] != 0))  # generated, not the prompt's padding

    # A task built around a converted backbone (the class kept, so KerasHub accepts it).
    rebuilt = task(backbone=model.backbone, preprocessor=None)
    rebuilt.compile(sampler="greedy")
    np.testing.assert_array_equal(rebuilt.generate(prompt, stop_token_ids=None)["token_ids"], expected["token_ids"])

    inputs = _inputs(3)
    labels = np.roll(inputs["token_ids"], -1, axis=1)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(inputs, labels, sample_weight=inputs["padding_mask"].astype("float32"), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_keras_hub_transformer_layers_in_a_functional_model():
    def build():
        tokens = keras.Input((LENGTH,), dtype="int32")
        memory_tokens = keras.Input((LENGTH,), dtype="int32")
        embedding = keras.layers.Embedding(VOCABULARY, 16, mask_zero=True)
        memory = keras_hub.layers.TransformerEncoder(32, 2, name="encoder")(embedding(memory_tokens))
        x = keras_hub.layers.TransformerDecoder(32, 2, name="decoder")(embedding(tokens), memory)
        return keras.Model([tokens, memory_tokens], x, name="seq2seq")

    reference, model = twins(build)
    report = keras_attn.convert(model, return_report=True)[1]
    assert type(model) is type(reference)
    assert sorted(report.converted) == [
        "seq2seq/decoder/cross_attention",
        "seq2seq/decoder/self_attention",
        "seq2seq/encoder/self_attention_layer",
    ]
    inputs = [_inputs(4)["token_ids"], _inputs(5)["token_ids"]]
    valid = inputs[0] != 0
    expected, got = ops.convert_to_numpy(reference(inputs)), ops.convert_to_numpy(model(inputs))
    assert max_difference(got[valid], expected[valid]) < TOLERANCE


def test_keras_file_reloads_the_original_attention_convert_again(tmp_path):
    reference, model = twins(lambda: _backbone("llama"))
    keras_attn.convert(model)
    model.save(tmp_path / "llama.keras")
    reloaded = keras.saving.load_model(tmp_path / "llama.keras")

    # KerasHub's decoder block builds its attention in its own code: reloaded, it is KerasHub's.
    attention = reloaded.get_layer("transformer_layer_0")._self_attention_layer
    assert type(attention) is type(reference.get_layer("transformer_layer_0")._self_attention_layer)
    inputs = _backbone_inputs("llama", 6)
    assert max_difference(reloaded(inputs), reference(inputs)) == 0.0
    report = keras_attn.convert(reloaded, return_report=True)[1]
    assert len(report.adapted) == LAYERS
    assert max_difference(reloaded(inputs), model(inputs)) == 0.0


def test_a_keras_hub_layer_named_attention_holding_keras_attention_is_a_container():
    dinov2_layers = pytest.importorskip(
        "keras_hub.src.models.dinov2.dinov2_layers", reason=f"KerasHub {keras_hub.__version__} has no DINOV2"
    )
    DINOV2Attention = dinov2_layers.DINOV2Attention

    def build():
        inputs = keras.Input((LENGTH, 16))
        return keras.Model(inputs, DINOV2Attention(16, 2, name="dino")(inputs), name="vision")

    reference, model = twins(build)
    report = keras_attn.convert(model, return_report=True)[1]
    assert (report.converted, report.unconverted) == (("vision/dino/attention",), ())
    x = np.random.default_rng(7).normal(size=(2, LENGTH, 16)).astype("float32")
    assert max_difference(model(x), reference(x)) < TOLERANCE


def test_an_attention_calling_keras_op_in_its_own_call_runs_keras_attn_op():
    from unittest import mock

    from keras_attn.layers.hub_adapters import op_in_call

    if not hasattr(keras_hub.models, "ESMBackbone"):
        pytest.skip(f"keras-hub {keras_hub.__version__} has no ESMBackbone")
    reference, model = twins(
        lambda: keras_hub.models.ESMBackbone(
            vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32
        )
    )
    report = keras_attn.convert(model, implementation="blockwise", return_report=True)[1]
    assert report.adapted == (f"{model.name}/transformer_layer_0/attention_layer",)
    inputs = _inputs(8)
    with mock.patch.object(op_in_call, "dot_product_attention", wraps=op_in_call.dot_product_attention) as ours:
        got = model({"token_ids": inputs["token_ids"]})
    assert ours.call_count == 1 and ours.call_args.kwargs["flash_attention"] is True  # blockwise: the streaming kernel
    assert max_difference(got, reference({"token_ids": inputs["token_ids"]})) < TOLERANCE
    with pytest.raises(ValueError, match=r"`implementation` of the adapted EsmSelfAttention must be one of"):
        keras_attn.convert(reference, implementation="chunked")({"token_ids": inputs["token_ids"]})


@pytest.mark.parametrize("name, extra", [("bert", {}), ("gpt2", {"dropout": 0.0}), ("llama", {}), ("gemma", {})])
def test_a_query_without_keys_keeps_keras_hubs_output_at_every_position(name, extra):
    """Left padding leaves a decoder's first padded query no key. KerasHub's output there is kept,
    padded positions included, with the gradients of a loss over every position: the mean of the
    values where Keras's layer runs `dot_product_attention` (GPT-2 without dropout: 0.36 apart
    with zero rows), zero weights through Keras's einsum path (dropout) or KerasHub's own softmax."""
    inputs = _backbone_inputs(name)
    inputs["padding_mask"] = np.ones((2, LENGTH), bool)
    inputs["padding_mask"][1, :3] = False
    inputs["token_ids"][~inputs["padding_mask"]] = 0
    reference, model = twins(lambda: _backbone(name, **extra))
    keras_attn.convert(model)
    weights = np.arange(16, dtype="float32")

    def run(m):
        with tf.GradientTape() as tape:
            output = _sequence_output(m, inputs)
            loss = tf.reduce_sum(output * weights)
        return output, [tf.convert_to_tensor(g) for g in tape.gradient(loss, m.trainable_variables) if g is not None]

    (expected, expected_gradients), (got, gradients) = run(reference), run(model)
    assert max_difference(got, expected) < TOLERANCE
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        assert max_difference(gradient, expected_gradient) < TOLERANCE * max(
            1.0, float(np.abs(expected_gradient).max())
        )


@pytest.mark.parametrize("name", ["gpt2", "llama", "gemma"])
def test_a_causal_lms_mask_reaches_the_dispatcher_with_the_causal_pattern(name, monkeypatch):
    # What the converting guide says of KerasHub's decoders: the mask their blocks build lies within
    # the causal pattern, and the attention passes that pattern with it, so the streaming kernels
    # skip the tiles above the diagonal.
    from keras_attn.dispatch import attention

    calls = []
    choose = attention._choose_implementation
    monkeypatch.setattr(
        attention,
        "_choose_implementation",
        lambda implementation, call: calls.append(call) or choose(implementation, call),
    )
    keras_attn.convert(_backbone(name))(_backbone_inputs(name))
    assert len(calls) == LAYERS
    assert all(
        isinstance(call.pattern, keras_attn.patterns.Causal) and tuple(call.mask.shape)[2:] == (LENGTH, LENGTH)
        for call in calls
    )


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "gemma2"])
def test_a_causal_lm_on_the_chunked_kernel_equals_the_original(name, monkeypatch):
    # Chunks of 4 queries, each over the keys up to its last query (the causal pattern): the keys
    # after it are skipped, the rest keep the block's mask (padding, Mistral's window in the mask,
    # Gemma 2's window and soft cap).
    from keras_attn.kernels import chunked

    monkeypatch.setattr(chunked, "QUERY_CHUNK_SIZE", 4)
    reference, model = twins(lambda: _backbone(name))
    keras_attn.convert(model, implementation="chunked")
    _check_outputs_and_gradients(reference, model, _backbone_inputs(name))
