"""Every backbone KerasHub registers converts with parity, or is named with the reason (`tests/keras_hub_architectures.py`).

The walk reads KerasHub's own registry (the `Backbone` classes `keras_hub.models` exports), so a
backbone a new release adds fails here until it has an entry. Each backbone is built tiny from its
constructor twice with the same weights (random: no preset is downloaded); the oracle is the twin
left unconverted: outputs within 1e-5 at real tokens, the gradients of a loss over them within
1e-5 of the model's largest gradient entry, the class kept, every attention layer on the route its
entry declares; causal and seq2seq LMs generate the same greedy tokens. A `.keras` file reloads
KerasHub's attention: converting it again gives the converted outputs, once per adapter module.
"""

import inspect
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_attn
from keras_attn.layers import hub_adapters
from tests.keras_hub_architectures import ARCHITECTURES
from tests.keras_hub_architectures import CONVERTED
from tests.keras_hub_architectures import KERAS_HUB_RELEASE
from tests.keras_hub_architectures import Converts
from tests.keras_hub_architectures import HubLayer
from tests.keras_hub_architectures import Named
from tests.keras_hub_architectures import Nested
from tests.keras_hub_architectures import NoAttention
from tests.keras_hub_architectures import architectures_table
from tests.twin_models import max_difference
from tests.twin_models import twins

keras_hub = pytest.importorskip("keras_hub")
if not keras_hub.__version__.startswith(KERAS_HUB_RELEASE):
    pytest.skip(
        f"the entries describe KerasHub {KERAS_HUB_RELEASE}x's registry; installed: {keras_hub.__version__}",
        allow_module_level=True,
    )

LENGTH, PADDED, PROMPT = 8, 3, 3  # sequence length; the second row's padded tail; a generation prompt's length
TOLERANCE = 1e-5


def registered_backbones():
    """The names of the backbone classes KerasHub exports: its registry, not a list of ours."""
    backbone = keras_hub.models.Backbone
    return sorted(
        {
            value.__name__  # by class: KerasHub exports some under a second name (ESM2Backbone, SmolLMBackbone)
            for value in vars(keras_hub.models).values()
            if inspect.isclass(value) and issubclass(value, backbone) and value is not backbone
        }
    )


def build(name, **overrides):
    """KerasHub's backbone `name`, tiny, from its entry's constructor arguments (nested backbones and layers built too)."""
    kwargs = {**ARCHITECTURES[name].kwargs, **overrides}
    return getattr(keras_hub.models, name)(**{key: _argument(value) for key, value in kwargs.items()})


def _argument(value):
    if isinstance(value, Nested):
        return build(value.name, **value.overrides)
    if isinstance(value, HubLayer):
        return getattr(keras_hub.layers, value.name)(**value.kwargs)
    return value


def backbone_inputs(model, seed=0, prompt=False):
    """Inputs for `model`'s own input spec: ids, segments, padding masks (the second row padded), features.

    With `prompt`, the token streams hold `PROMPT` real tokens then padding (what `generate` fills).
    """
    rng = np.random.default_rng(seed)
    spec = model.input if isinstance(model.input, dict) else {"inputs": model.input}
    shapes = ARCHITECTURES[type(model).__name__].inputs or {}
    inputs = {}
    for key, tensor in spec.items():
        shape = (2, *shapes.get(key, [LENGTH if size is None else size for size in tensor.shape[1:]]))
        if "segment" in key:
            inputs[key] = np.zeros(shape, tensor.dtype)
        elif "padding_mask" in key or ("mask" in key and tensor.dtype == "bool"):  # SAM's "masks" are images
            inputs[key] = _padding_mask(shape, prompt and "encoder" not in key).astype(tensor.dtype)
        elif "int" in str(tensor.dtype):
            inputs[key] = rng.integers(1, 60, shape).astype(tensor.dtype)
        else:
            inputs[key] = rng.normal(size=shape).astype("float32")
    for key in inputs:  # padded ids are 0, as a tokenizer pads them
        mask_key = key.replace("token_ids", "padding_mask")
        if "token_ids" in key and mask_key in inputs:
            inputs[key] = np.where(inputs[mask_key], inputs[key], 0).astype(inputs[key].dtype)
    return inputs if isinstance(model.input, dict) else inputs["inputs"]


def _padding_mask(shape, prompt):
    mask = np.ones(shape, bool)
    if prompt:
        mask[:, PROMPT:] = False
    elif shape[1:] == (LENGTH,):  # a token stream: the second row padded; raw audio stays whole
        mask[1, -PADDED:] = False
    return mask


def _real(output):
    """Which entries of an output are real tokens: the second row's padded tail is not."""
    valid = np.ones(output.shape, bool)
    if output.ndim >= 2 and output.shape[1] == LENGTH:
        valid[1, -PADDED:] = False
    return valid


def outputs_and_gradients(model, inputs):
    """The float outputs, and the gradients of a weighted sum of them over real tokens."""
    with tf.GradientTape() as tape:
        result = model(inputs)
        outputs = [y for y in (result.values() if isinstance(result, dict) else [result]) if y.dtype.is_floating]
        weights = np.random.default_rng(1)
        loss = sum(
            tf.reduce_sum(tf.where(_real(y), y * weights.normal(size=y.shape[-1:]).astype("float32"), 0.0))
            for y in outputs
        )
    gradients = tape.gradient(loss, model.trainable_variables)
    return [ops.convert_to_numpy(y) for y in outputs], [
        None if g is None else tf.convert_to_tensor(g) for g in gradients
    ]


def check_parity(reference, model, inputs):
    """Outputs within `TOLERANCE` at real tokens, gradients within `TOLERANCE` of the largest gradient entry."""
    (expected, expected_gradients), (got, got_gradients) = (
        outputs_and_gradients(m, inputs) for m in (reference, model)
    )
    output_difference = max(max_difference(g[_real(g)], e[_real(e)]) for g, e in zip(got, expected))
    assert [g is None for g in got_gradients] == [e is None for e in expected_gradients]
    pairs = [(g, e) for g, e in zip(got_gradients, expected_gradients) if e is not None]
    # Relative to the largest gradient entry of the model: a gradient that is 0 in exact arithmetic
    # (a key bias, which the softmax cancels) carries the rounding of the logits it is summed from.
    largest = max(1.0, max(float(np.max(np.abs(e))) for _, e in pairs))
    gradient_difference = max(max_difference(g, e) for g, e in pairs) / largest
    assert output_difference < TOLERANCE and gradient_difference < TOLERANCE, (output_difference, gradient_difference)


def routes(model, report):
    """The routes the report's layers took: `CONVERTED`, or the adapter module's name."""
    layers = {path: layer for path, layer in _layers_by_path(model)}
    taken = {CONVERTED for _ in report.converted}
    taken |= {type(layers[path]).__module__.rsplit(".", 1)[1] for path in report.adapted}
    return taken


def _layers_by_path(model):
    found = []

    def visit(layer, path):
        found.append((path, layer))
        for child in getattr(layer, "_layers", []):
            visit(child, f"{path}/{child.name}")

    visit(model, model.name)
    return found


def test_every_backbone_of_the_registry_has_an_entry_and_every_entry_is_registered():
    registered = registered_backbones()
    assert [name for name in registered if name not in ARCHITECTURES] == []
    assert sorted(set(ARCHITECTURES) - set(registered)) == []


@pytest.mark.keras_hub_walk
@pytest.mark.parametrize("name", [name for name in registered_backbones() if name in ARCHITECTURES])
def test_backbone_converts_with_parity_or_convert_names_why(name):
    entry = ARCHITECTURES[name]
    if isinstance(entry, NoAttention) or entry.kwargs is None:
        assert (entry.what if isinstance(entry, NoAttention) else entry.reason).strip()
        return
    if isinstance(entry, Named):
        with pytest.raises(ValueError, match=entry.match):
            keras_attn.convert(build(name))
        return
    reference, model = twins(lambda: build(name))
    converted, report = keras_attn.convert(model, return_report=True)
    assert converted is model and type(model) is type(reference)
    assert report.unconverted == ()
    assert routes(model, report) == set(entry.routes)
    check_parity(reference, model, backbone_inputs(model))


def _lm_names():
    return [name for name, entry in ARCHITECTURES.items() if isinstance(entry, Converts) and entry.lm]


def greedy_tokens(lm, prompt):
    """The tokens greedy `generate` writes (a seq2seq LM's decoder tokens): its compiled function (`make_generate_function`), on one batch.

    `generate` runs this function per batch and then concatenates every output it returned; Gemma 3's,
    text-only and without a preprocessor, returns `images=None`, which that concatenation refuses.
    """
    lm.compile(sampler="greedy")
    outputs = lm.make_generate_function()(prompt, stop_token_ids=None)
    return ops.convert_to_numpy(outputs.get("token_ids", outputs.get("decoder_token_ids")))


@pytest.mark.keras_hub_walk
@pytest.mark.parametrize("name", _lm_names())
def test_language_model_generates_the_same_greedy_tokens(name):
    task = getattr(keras_hub.models, ARCHITECTURES[name].lm)
    reference, model = twins(lambda: task(backbone=build(name), preprocessor=None))
    prompt = backbone_inputs(model.backbone, seed=2, prompt=True)
    expected = greedy_tokens(reference, prompt)
    keras_attn.convert(model)
    assert type(model) is task
    got = greedy_tokens(model, prompt)
    np.testing.assert_array_equal(got, expected)
    assert bool(np.all(got[:, PROMPT:] != 0))  # generated, not the prompt's padding


def _one_backbone_per_adapter():
    """The backbones that take each adapter module of the registry first (one may take several)."""
    chosen = {}
    for name, entry in ARCHITECTURES.items():
        for route in entry.routes if isinstance(entry, Converts) else ():
            chosen.setdefault(route, name)
    return sorted({chosen[module] for module in hub_adapters.ADAPTERS.values()})


@pytest.mark.keras_hub_walk
@pytest.mark.parametrize("name", _one_backbone_per_adapter())
def test_keras_file_reloads_then_converts_again(name, tmp_path):
    model = keras_attn.convert(build(name))
    inputs = backbone_inputs(model, seed=4)
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    report = keras_attn.convert(reloaded, return_report=True)[1]
    assert report.adapted and report.unconverted == ()
    expected, got = outputs_and_gradients(model, inputs)[0], outputs_and_gradients(reloaded, inputs)[0]
    assert max(max_difference(g, e) for g, e in zip(got, expected)) < TOLERANCE


def test_every_adapter_module_is_exercised_by_a_backbone():
    exercised = {route for entry in ARCHITECTURES.values() if isinstance(entry, Converts) for route in entry.routes}
    assert set(hub_adapters.ADAPTERS.values()) <= exercised


def test_the_converting_guide_lists_every_architecture_as_the_entries_say():
    guide = Path(keras_attn.__file__).parents[1] / "docs" / "guides" / "converting_models.md"
    assert architectures_table() in guide.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["T5Backbone", "T5GemmaBackbone", "T5Gemma2Backbone"])
def test_rows_without_keys_keep_keras_hubs_outputs_and_gradients_at_every_position(name):
    """Padding at the front leaves queries without keys: T5's decoder's, and T5Gemma 2's encoder's
    first query, whose sliding window holds only padding. The `-1e9` mask gives them the softmax of
    the mask's values and a gradient through their logits, which the adapters keep: the mean of the
    values for one `-1e9`, and where T5Gemma 2 adds its window's `-1e9` to the padding's, no weight
    on the keys at `-2e9`. Every position, and the gradients of a loss over all of them."""
    reference, model = twins(lambda: build(name))
    inputs = backbone_inputs(reference)
    for key, tensor in inputs.items():
        if tensor.ndim == 2 and tensor.shape[1] == LENGTH:
            inputs[key] = tensor[:, ::-1].copy()  # the second row padded at the front
    keras_attn.convert(model)

    def run(m):
        with tf.GradientTape() as tape:
            outputs = [y for y in m(inputs).values() if y.dtype.is_floating]
            loss = sum(tf.reduce_sum(y * tf.sin(tf.range(y.shape[-1], dtype=y.dtype))) for y in outputs)
        return outputs, [tf.convert_to_tensor(g) for g in tape.gradient(loss, m.trainable_variables) if g is not None]

    (expected, expected_gradients), (got, gradients) = run(reference), run(model)
    assert max(max_difference(a, b) for a, b in zip(got, expected, strict=True)) < TOLERANCE
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        assert max_difference(gradient, expected_gradient) < TOLERANCE * max(
            1.0, float(np.abs(expected_gradient).max())
        )
