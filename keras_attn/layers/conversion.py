"""`convert`: a Keras model's attention layers run keras_attn's kernels, changed in place.

Like Hugging Face's `attn_implementation="sdpa"`, one call switches the attention of a model the
user already has, and the model stays the same object. `convert(model)` walks every layer `model`
holds, wherever it sits: Functional, Sequential and subclassed models, custom layers (the keras.io
examples' `TransformerBlock`), KerasHub backbones and task models, to any depth. It changes the
class of each attention layer in place:

- `keras.layers.MultiHeadAttention` becomes `keras_attn.MultiHeadAttention`; a subclass of it
  (KerasHub's `CachedMultiHeadAttention`, a user's own) becomes a class deriving from the
  subclass and from ours, so that the subclass's own `call` (its cache) runs our attention
  through Keras's `_compute_attention` hook;
- a KerasHub attention layer of its own kind (Llama, Qwen, Gemma, T5, Falcon, DeBERTa, ...) gets its
  adapter's hook (`keras_attn.layers.hub_adapters`), which computes its attention with
  `keras_attn.scaled_dot_product_attention`.

Each KerasHub decoder block whose mask builder makes a causal mask gets that builder wrapped on
the instance, so that its attention passes the causal pattern with the mask and the kernels skip
what it hides (`hub_adapters.causal_masks`). Nothing else changes: the layers keep their
sublayers and variables (the same objects, so the same weights and variable paths), the model
keeps its class, its compile state and its task methods (`fit`, `predict`, KerasHub's
`generate`; functions traced before are dropped, to be traced again with our layers). Saving writes each layer's config: the attention layers of a Functional or
Sequential model are saved converted and reload converted (their `implementation` kept); a layer
or model whose own code builds its attention (a custom layer, a subclassed model, every KerasHub
block) reloads as that code builds it, with Keras's or KerasHub's attention: convert it again
after loading. What cannot be converted is named with the reason; a model in which nothing runs
keras_attn's attention after the call is an error (`strict=True`) or a warning, never silent.
"""

import dataclasses
import warnings

import keras

from keras_attn.dispatch.attention import ATTENTION_IMPLEMENTATIONS
from keras_attn.keras_internals import layer_tree
from keras_attn.keras_internals import sublayers
from keras_attn.layers import hub_adapters
from keras_attn.layers.hub_adapters import causal_masks
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.validation import check_bool
from keras_attn.validation import check_choice

_KERAS_MHA = keras.layers.MultiHeadAttention
_REGISTERED_NAME = "ConvertedMultiHeadAttention"
_CONVERTED_FROM = "keras_attn_converted_from"  # the config key naming the subclass a layer came from
# Methods of Keras's layer that compute the attention itself: ours replace them, so a subclass
# that overrides one would lose its override.
_ATTENTION_INTERNALS = ("_compute_attention", "_masked_softmax", "_build_attention")
# The functions a model traces once and keeps (Keras's trainer, KerasHub's task models): traced
# before `convert`, they would keep running the attention they were traced with.
_TRACED_FUNCTIONS = ("train_function", "test_function", "predict_function", "generate_function")


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What `convert` did, layer by layer; paths are `model/.../layer` by layer names.

    Attributes:
        converted: the `keras.layers.MultiHeadAttention` layers (subclasses included) now ours.
        adapted: the KerasHub attention layers of their own kind (Llama, Qwen, Gemma, T5, ...) whose
            attention now runs through an adapter of `keras_attn.layers.hub_adapters`.
        unconverted: `(path, reason)` for each attention layer kept as it was.
        already_ours: the layers that ran keras_attn's attention already (`keras_attn.MultiHeadAttention`
            and its subclasses, adapted KerasHub layers), left as they are, their `implementation` kept.
    """

    converted: tuple = ()
    unconverted: tuple = ()
    already_ours: tuple = ()
    adapted: tuple = ()

    def __str__(self):
        lines = [
            f"{len(self.converted)} attention layer(s) converted, {len(self.adapted)} adapted (KerasHub), "
            f"{len(self.unconverted)} not converted, {len(self.already_ours)} already keras_attn's"
        ]
        lines += [f"  converted: {path}" for path in self.converted]
        lines += [f"  adapted: {path}" for path in self.adapted]
        lines += [f"  already keras_attn's: {path}" for path in self.already_ours]
        lines += [f"  not converted: {path}: {reason}" for path, reason in self.unconverted]
        return "\n".join(lines)


def convert(model, *, implementation="auto", strict=True, return_report=False):
    """Make every attention layer of `model` run keras_attn's attention, in place; returns `model`.

    Every `keras.layers.MultiHeadAttention` that `model` holds, at any depth (inside custom layers,
    KerasHub blocks, nested and subclassed models), becomes `keras_attn.MultiHeadAttention` (a
    subclass of Keras's layer becomes a class deriving from it and from ours, its own `call` kept),
    and every KerasHub attention layer with an adapter (Llama, Mistral, Gemma: grouped-query heads,
    rotary embeddings, sliding windows, their caches) computes its attention with
    `keras_attn.scaled_dot_product_attention`. The model computes the same outputs and gradients
    (up to float rounding) with the same variables, a query whose keys are all masked (a padded
    query) included: a converted layer has `rows_without_keys="keras"`, so such a row gets what
    Keras's layer gives it (the output projection of the mean of the values), which a later layer
    reads once a plain `x + y` has dropped the Keras mask. The model keeps its class, object
    graph, weights, variable paths, compile state and task methods (`fit`, `predict`, `save`,
    KerasHub's `generate`). KerasHub's default sampler (`"top_k"`) is random, so compare
    `generate` before and after `convert` with `compile(sampler="greedy")`: the converted model
    then generates the same tokens.
    Layers that run ours already are left as they are (their own `implementation` kept) and
    listed in the report's `already_ours`: converting twice changes nothing.

    Saving: a Functional or Sequential model's attention layers are saved converted and reload
    converted; a custom layer, subclassed model or KerasHub block builds its attention in its own
    code, so it reloads with Keras's or KerasHub's attention: call `convert` again after
    `keras.saving.load_model`. A quantized model converts like any other (`Model.quantize` before or
    after `convert`).

    Not converted, and named with the reason: subclasses of Keras's layer that override the
    attention computation (`_compute_attention`, `_masked_softmax`, `_build_attention`) or whose
    `call` never reaches `_compute_attention`; KerasHub attention layers without an adapter, or
    whose attention the core op cannot compute.

    Args:
        model: a `keras.Model` of any kind (Functional, Sequential, subclassed, a KerasHub backbone
            or task model).
        implementation: the attention kernel of every converted layer, as for
            `keras_attn.MultiHeadAttention`: `"auto"` (default; picks per call), `"dense"`,
            `"chunked"`, `"blockwise"` or `"strided"`. They compute the same outputs and differ
            in speed and memory; a kernel that needs a pattern (`"chunked"`: a causal mask or a
            sliding window) raises at a call without one, so `"auto"` suits mixed models.
        strict: if `True` (default), a `ValueError` lists every attention layer that cannot be
            converted, with its reason, and the model is left unchanged; so does a model with no
            attention layer that runs keras_attn's after the call. If `False`, those layers are
            kept as they are and a warning says so.
        return_report: if `True`, also return a `ConversionReport` (`converted`, `adapted`,
            `unconverted` `(path, reason)` pairs, `already_ours`).

    Returns:
        `model` itself; `(model, report)` when `return_report=True`.

    Raises:
        ValueError: when an argument is invalid (naming it and the value received), or, with
            `strict=True`, when an attention layer cannot be converted (naming each and why) or
            when no attention layer of the model would run keras_attn's.

    Example:

    >>> inputs = keras.Input((16, 32))
    >>> attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8, name="attention")
    >>> model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True), name="encoder")
    >>> x = keras.random.normal((2, 16, 32), seed=0)
    >>> before = model(x)
    >>> fast, report = convert(model, implementation="chunked", return_report=True)
    >>> fast is model, type(model.get_layer("attention")).__module__, report.converted, report.unconverted
    (True, 'keras_attn.layers.multi_head_attention', ('encoder/attention',), ())
    >>> convert(model, return_report=True)[1].already_ours  # a second convert changes nothing
    ('encoder/attention',)
    >>> bool(keras.ops.max(keras.ops.abs(model(x) - before)) < 1e-5)
    True
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}")
    check_choice("implementation", implementation, ATTENTION_IMPLEMENTATIONS)
    check_bool("strict", strict)
    check_bool("return_report", return_report)

    converted, adapted, unconverted, already_ours = [], [], [], []
    changes = []  # what to change, once every layer has been checked
    for path, layer in _attention_layers(model):
        if isinstance(layer, MultiHeadAttention) or hub_adapters.is_adapted(layer):
            already_ours.append(path)
        elif isinstance(layer, _KERAS_MHA):
            reason = _why_not_convertible(layer)
            if reason is None:
                converted.append(path)
                changes.append(lambda layer=layer: _convert_attention(layer, implementation))
            else:
                unconverted.append((path, reason))
        else:
            reason = hub_adapters.why_not_adapted(layer)
            if reason is None:
                adapted.append(path)
                changes.append(lambda layer=layer: hub_adapters.adapt(layer, implementation))
            else:
                unconverted.append((path, reason))
    report = ConversionReport(tuple(converted), tuple(unconverted), tuple(already_ours), tuple(adapted))
    _check_outcome(model, report, strict)
    for change in changes:
        change()
    for layer in layer_tree(model):  # a decoder block's causal mask reaches the kernels as the pattern too
        causal_masks.recognise(layer)
    _drop_traced_functions(model)
    return (model, report) if return_report else model


def _check_outcome(model, report, strict):
    """Raise (`strict`) or warn when an attention layer stays unconverted or nothing would run ours."""
    if report.unconverted and strict:
        raise ValueError(
            f"`convert` cannot convert every attention layer of the model `{model.name}` ({type(model).__name__}) "
            "(pass strict=False to keep these as they are):\n"
            + "\n".join(f"  {path}: {reason}" for path, reason in report.unconverted)
        )
    if not (report.converted or report.adapted or report.already_ours):
        found = "".join(f"\n  {path}: {reason}" for path, reason in report.unconverted) or " no attention layer"
        message = (
            f"`convert` found no attention layer it can convert in the model `{model.name}` "
            f"({type(model).__name__}), so the model is unchanged. Found:{found}"
        )
        if strict:
            raise ValueError(message)
        warnings.warn(message, stacklevel=3)
    elif report.unconverted:
        warnings.warn(
            f"keras_attn.convert kept {len(report.unconverted)} attention layer(s) unconverted:\n{report}",
            stacklevel=3,
        )


def _attention_layers(model):
    """`(path, layer)` for every attention layer `model` holds, depth first, each layer once.

    An attention layer is a `keras.layers.MultiHeadAttention` (subclasses included) or a KerasHub
    attention layer of its own kind; their own sublayers (projections, rotary embeddings) are not
    visited. A KerasHub layer named as attention that holds attention layers (SAM's
    `TwoWayMultiHeadAttention`, DINOv2's `DINOV2Attention`) is a container: its attention layers
    are visited instead. A layer
    reached by several paths (shared) is listed at its first.
    """
    found, seen = [], set()

    def visit(layer, path):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if isinstance(layer, _KERAS_MHA) or (hub_adapters.is_hub_attention(layer) and not _holds_attention(layer)):
            found.append((path, layer))
            return
        for child in sublayers(layer):
            visit(child, f"{path}/{child.name}")

    visit(model, model.name)
    return found


def _holds_attention(layer):
    """Whether an attention layer (Keras's, or a KerasHub one) is among the layers `layer` holds, at any depth."""
    return any(
        isinstance(sublayer, _KERAS_MHA) or hub_adapters.is_hub_attention(sublayer)
        for sublayer in layer_tree(layer)
        if sublayer is not layer
    )


def _why_not_convertible(layer):
    """`None` if Keras's `layer` (or a subclass's) can run ours, else the reason it cannot."""
    subclass = type(layer)
    overridden = _overridden_methods(subclass)
    for name in _ATTENTION_INTERNALS:
        if name in overridden:
            return (
                f"its class {subclass.__name__} overrides `{name}`, part of the attention computation "
                "that convert replaces; its own computation would be lost"
            )
    if "call" in overridden:
        names = overridden["call"].__code__.co_names
        if "_compute_attention" not in names and not ("super" in names and "call" in names):
            return (
                f"its class {subclass.__name__} overrides `call` and computes attention without "
                "`_compute_attention` (the hook convert plugs into), so there is nothing to replace"
            )
    elif "_compute_attention_mask" in overridden:
        return (
            f"its class {subclass.__name__} overrides `_compute_attention_mask`, which "
            "keras_attn.MultiHeadAttention's call does not use; its masking would be lost"
        )
    return None


def _overridden_methods(subclass):
    """`{name: function}` defined by `subclass` and its bases below Keras's layer (nearest first)."""
    methods = {}
    for klass in subclass.__mro__:
        if klass is _KERAS_MHA:
            break
        for name, value in vars(klass).items():
            methods.setdefault(name, value)
    return methods


def _convert_attention(layer, implementation):
    """Keras's `layer` becomes ours in place: its class, then the state ours adds (its variables stay)."""
    subclass = type(layer)
    layer.__class__ = MultiHeadAttention if subclass is _KERAS_MHA else converted_class(subclass)
    layer._init_own_state(implementation=implementation, rows_without_keys="keras")  # Keras's outputs kept


def _drop_traced_functions(model):
    """Forget the functions every model in `model` traced with the attention it had (traced again on use)."""
    for layer in layer_tree(model):
        for name in _TRACED_FUNCTIONS:
            if getattr(layer, name, None) is not None:
                setattr(layer, name, None)


@keras.saving.register_keras_serializable(package="keras_attn", name=_REGISTERED_NAME)
class _Converted(MultiHeadAttention):
    """The base of every converted subclass: `class Converted(Subclass, _Converted)`.

    Its config names the subclass (by its registered name) so that loading a `.keras` file
    rebuilds the same converted class; every converted class is saved under this class's
    registered name, and this class's `from_config` dispatches to the right one.
    """

    _converted_from = None  # the Keras subclass, set on each converted class

    def get_config(self):
        return {**super().get_config(), _CONVERTED_FROM: keras.saving.get_registered_name(self._converted_from)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        name = config.pop(_CONVERTED_FROM, None)
        if cls is _Converted:  # loading: find the subclass, then its converted class
            subclass = keras.saving.get_registered_object(name)
            if subclass is None:
                raise ValueError(
                    f"Cannot rebuild the converted attention layer: its class {name!r} is not registered. "
                    "Import the module that registers it (keras.saving.register_keras_serializable), or pass "
                    f"it in `custom_objects`, as loading the original model needs. Received: config={config}"
                )
            return converted_class(subclass).from_config(config)
        return super().from_config(config)


_CONVERTED_CLASSES = {}


def converted_class(subclass):
    """The class that runs `subclass`'s code with our attention: `(subclass, keras_attn's)` bases, cached.

    A subclass that overrides `call` keeps its call's signature and output: `compute_output_spec`
    and `compute_output_shape` stay the subclass's (Keras's) so that a Functional model traces the
    same outputs.
    """
    if subclass not in _CONVERTED_CLASSES:
        namespace = {"_converted_from": subclass, "__module__": __name__, "__doc__": subclass.__doc__}
        if "call" in _overridden_methods(subclass):
            namespace["compute_output_spec"] = subclass.compute_output_spec
            namespace["compute_output_shape"] = subclass.compute_output_shape
        converted = type(subclass.__name__, (subclass, _Converted), namespace)
        # Saved under _Converted's registered name (its from_config finds this class again)...
        keras.saving.register_keras_serializable(package="keras_attn", name=_REGISTERED_NAME)(converted)
        # ...which keeps resolving to _Converted itself.
        keras.saving.register_keras_serializable(package="keras_attn", name=_REGISTERED_NAME)(_Converted)
        _CONVERTED_CLASSES[subclass] = converted
    return _CONVERTED_CLASSES[subclass]
