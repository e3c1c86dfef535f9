"""`convert`: a copy of an existing Keras model whose `keras.layers.MultiHeadAttention` layers are ours.

The copy is rebuilt with `keras.models.clone_model` (Functional and Sequential models, nested ones
included), every attention layer replaced by `keras_attn.MultiHeadAttention` with the same config
and weights, every other layer cloned, and all weights copied across. A subclass of Keras's layer
(KerasHub's cached attention, a user's own) keeps its own `call`: its converted class derives from
both it and ours, so its call runs ours through the `_compute_attention` hook. What cannot be
replaced is named with the reason; nothing is skipped in silence.
"""

import dataclasses
import warnings

import keras

from keras_attn.core.attention import ATTENTION_IMPLEMENTATIONS
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.validation import check_bool
from keras_attn.validation import check_choice

_KERAS_MHA = keras.layers.MultiHeadAttention
_REGISTERED_NAME = "ConvertedMultiHeadAttention"
_CONVERTED_FROM = "keras_attn_converted_from"  # the config key naming the subclass a layer came from
# Methods of Keras's layer that compute the attention itself: ours replace them, so a subclass
# that overrides one would lose its override.
_ATTENTION_INTERNALS = ("_compute_attention", "_masked_softmax", "_build_attention")


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What `convert` did, layer by layer.

    Attributes:
        converted: the paths (`model/.../layer`) of the attention layers replaced by ours.
        unconverted: `(path, reason)` for each attention layer kept as it was.
        already_ours: the paths of the layers that were `keras_attn.MultiHeadAttention` already
            (subclasses included), copied as they are, their own `implementation` kept.
    """

    converted: tuple = ()
    unconverted: tuple = ()
    already_ours: tuple = ()

    def __str__(self):
        lines = [
            f"{len(self.converted)} attention layer(s) converted, {len(self.unconverted)} not converted, "
            f"{len(self.already_ours)} already keras_attn's"
        ]
        lines += [f"  converted: {path}" for path in self.converted]
        lines += [f"  already keras_attn's: {path}" for path in self.already_ours]
        lines += [f"  not converted: {path}: {reason}" for path, reason in self.unconverted]
        return "\n".join(lines)


def convert(model, *, implementation="auto", strict=True, return_report=False):
    """A copy of `model` in which every `keras.layers.MultiHeadAttention` is `keras_attn.MultiHeadAttention`.

    The layers of the copy have the names, configs and weights of the original's, so the copy
    computes the same outputs (up to float rounding; a query whose keys are all masked gets a zero
    output where Keras gives the mean of the values). Subclasses of Keras's layer are converted
    too: the converted class derives from the subclass and from ours, so the subclass's own
    `call` (e.g. KerasHub's `CachedMultiHeadAttention`, with its cache) runs our attention
    through Keras's `_compute_attention` hook. Layers that are already ours are copied as they
    are (their own `implementation` kept) and listed in the report's `already_ours`. The copy
    saves and loads as `.keras` (a converted subclass reloads where the subclass itself is
    registered or passed in `custom_objects`, as the original needs).
    The copy is not compiled, as with `keras.models.clone_model`.

    Not converted, and named with the reason: attention layers inside a custom layer or a
    subclassed model (their own code builds them; `clone_model` cannot rebuild them), subclasses
    that override the attention computation (`_compute_attention`, `_masked_softmax`,
    `_build_attention`), and subclasses whose `call` never reaches `_compute_attention`. A
    quantized model is refused: convert it before `Model.quantize`, then quantize the copy.

    Args:
        model: a Functional or Sequential `keras.Model`; the Functional and Sequential models
            nested in it are converted too. A subclassed model is refused (`ValueError` listing
            its attention layers): its own code builds its layers.
        implementation: the attention kernel of every converted layer, as for
            `keras_attn.MultiHeadAttention`: `"auto"` (default; picks per call), `"dense"`,
            `"chunked"`, `"blockwise"` or `"strided"`. They compute the same outputs and differ
            in speed and memory; a kernel that needs a pattern (`"chunked"`: a causal mask or a
            sliding window) raises at a call without one, so `"auto"` suits mixed models.
        strict: if `True` (default), a `ValueError` lists every attention layer that cannot be
            converted, with its reason, and no copy is returned. If `False`, those layers are
            copied unchanged and a warning lists them.
        return_report: if `True`, also return a `ConversionReport` (`converted` paths,
            `unconverted` `(path, reason)` pairs, `already_ours` paths).

    Returns:
        The converted copy; `(copy, report)` when `return_report=True`.

    Raises:
        ValueError: when an argument is invalid (naming it and the value received), when `model`
            is a subclassed or a quantized model, or, with `strict=True`, when an attention layer cannot be
            converted (naming each and why).

    Example:

    >>> inputs = keras.Input((16, 32))
    >>> attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8, name="attention")
    >>> x = attention(inputs, inputs, use_causal_mask=True)
    >>> model = keras.Model(inputs, keras.layers.LayerNormalization()(inputs + x), name="encoder")
    >>> fast, report = convert(model, implementation="chunked", return_report=True)
    >>> type(fast.get_layer("attention")).__module__, report.converted, report.unconverted
    ('keras_attn.layers.multi_head_attention', ('encoder/attention',), ())
    >>> convert(fast, return_report=True)[1].already_ours  # a second convert changes nothing
    ('encoder/attention',)
    >>> x = keras.random.normal((2, 16, 32), seed=0)
    >>> bool(keras.ops.max(keras.ops.abs(fast(x) - model(x))) < 1e-5)
    True
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model (Functional or Sequential). Received: model={model!r}")
    check_choice("implementation", implementation, ATTENTION_IMPLEMENTATIONS)
    check_bool("strict", strict)
    check_bool("return_report", return_report)
    if not _rebuildable(model):
        found = "".join(f"\n  {path}: {reason}" for path, _, reason in _attention_layers(model))
        raise ValueError(
            "`convert` copies Functional and Sequential models; a subclassed model's own code builds its "
            f"layers (build it with keras_attn.MultiHeadAttention instead). Received: model={model!r}{found}"
        )
    quantized = [layer.path for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)]
    if quantized:
        raise ValueError(
            "`convert` cannot copy a quantized model (keras.models.clone_model rebuilds quantized layers "
            "unquantized): convert the model before Model.quantize, then quantize the copy. "
            f"Received: model={model!r} with quantized layers {quantized}"
        )

    decisions = {}  # id(attention layer) -> its replacement's factory (only for the ones converted)
    converted, unconverted, already_ours = [], [], []
    for path, layer, container in _attention_layers(model):
        reason = container or _why_not_convertible(layer)
        if reason is None and isinstance(layer, MultiHeadAttention):
            already_ours.append(path)  # copied by clone_model as it is
        elif reason is None:
            decisions[id(layer)] = lambda layer=layer: _replacement(layer, implementation)
            converted.append(path)
        else:
            unconverted.append((path, reason))
    report = ConversionReport(tuple(converted), tuple(unconverted), tuple(already_ours))
    if unconverted and strict:
        raise ValueError(
            "`convert` cannot replace every attention layer of the model (pass strict=False to keep "
            "these as they are):\n" + "\n".join(f"  {path}: {reason}" for path, reason in unconverted)
        )
    if unconverted:
        warnings.warn(
            f"keras_attn.convert kept {len(unconverted)} attention layer(s) unconverted:\n{report}", stacklevel=2
        )

    def clone_layer(layer):
        factory = decisions.get(id(layer))
        return factory() if factory is not None else layer.__class__.from_config(layer.get_config())

    copy = keras.models.clone_model(model, clone_function=clone_layer, recursive=True)
    _copy_weights(model, copy)
    return (copy, report) if return_report else copy


def _attention_layers(model):
    """`(path, layer, reason or None)` for every attention layer in `model`, depth first.

    The reason is set for a layer `clone_model` cannot reach: one inside a custom layer or a
    subclassed model, which builds its own sublayers in its own code.
    """
    found = []

    def visit(layer, path, container):
        if isinstance(layer, _KERAS_MHA):
            found.append((path, layer, container))
            return
        if container is None and not _rebuildable(layer):
            kind = "subclassed model" if isinstance(layer, keras.Model) else "custom layer"
            container = (
                f"inside the {kind} `{layer.name}` ({type(layer).__name__}), whose own code builds its "
                "sublayers: convert replaces layers of Functional and Sequential models only (build "
                f"`{type(layer).__name__}` with keras_attn.MultiHeadAttention instead)"
            )
        children = (
            layer.layers
            if isinstance(layer, keras.Model)
            else layer._flatten_layers(include_self=False, recursive=False)
        )
        for child in children:
            visit(child, f"{path}/{child.name}", container)

    visit(model, model.name, None)
    # A layer shared by several paths is converted (or not) once: keep its first path.
    seen, unique = set(), []
    for path, layer, container in found:
        if id(layer) not in seen:
            seen.add(id(layer))
            unique.append((path, layer, container))
    return unique


def _rebuildable(layer):
    """Whether `clone_model` rebuilds `layer` layer by layer: a Sequential or Functional model (a
    `keras.Model` that is a `keras.Function` of its inputs; a subclassed model is not)."""
    return isinstance(layer, keras.Sequential) or isinstance(layer, keras.Model) and isinstance(layer, keras.Function)


def _why_not_convertible(layer):
    """`None` if `layer` can be replaced by ours, else the reason it cannot."""
    subclass = type(layer)
    if issubclass(subclass, MultiHeadAttention):
        return None  # already ours: nothing to replace
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


def _replacement(layer, implementation):
    """Ours (or the subclass's converted class), unbuilt, from `layer`'s config."""
    config = {**layer.get_config(), "implementation": implementation}
    subclass = type(layer)
    if subclass is _KERAS_MHA:
        return MultiHeadAttention.from_config(config)
    return converted_class(subclass).from_config(config)


def _copy_weights(model, copy):
    """Every weight of `model` into `copy`, checked one by one (names follow the same layers)."""
    weights, copies = model.weights, copy.weights
    if len(weights) != len(copies) or any(tuple(w.shape) != tuple(c.shape) for w, c in zip(weights, copies)):
        raise ValueError(
            "The converted copy's weights do not line up with the model's: "
            f"{[(w.path, tuple(w.shape)) for w in weights]} vs {[(c.path, tuple(c.shape)) for c in copies]}"
        )
    for weight, target in zip(weights, copies):
        target.assign(weight)


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
