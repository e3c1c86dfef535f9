"""What `implementation="auto"` chooses, and why: each kernel's predicted time and peak memory.

Each kernel of the registry (`keras_attn.kernels.KERNELS`) turns a call into the features of
`keras_attn.kernels.cost` (the pairs it computes, its loop steps, the pairwise values it holds);
a calibration gives, per kernel and per mode (`"forward"`, or `"training"`: forward and backward),
one coefficient per feature, so that a prediction is a dot product: seconds for the time features,
bytes for the memory features. Keras's own layer is modelled the same way (`KERAS_DENSE`: its
logits, softmax weights and dropout in the compute dtype), as the memory ceiling:

- the candidates are the kernels that take the call (`why_unsupported(call)` is `None`);
- the admissible ones are predicted to hold at most Keras's dense attention's peak for the call,
  and unroll at most `cost.MAX_UNROLLED_STEPS` steps into the graph;
- `"auto"` takes the admissible candidate predicted fastest, or, when none is admissible, the
  candidate predicted lightest among those unrolling no more (the dense kernel is one step). With
  an unknown query or key length there is nothing to predict from: the first candidate of the
  registry (dense) is taken.

The calibration is `calibration.json` beside this module (fitted by `benchmarks/dispatch_grid.py`,
shipped with the package) unless `keras_attn.tune()` stored one in the user's cache directory
(`$KERAS_ATTN_CACHE`, else `~/.cache/keras_attn`), whose entries then take precedence. The choice
is cached per call signature, so it is deterministic for a signature within a process.
"""

import dataclasses
import functools
import json
import os
from pathlib import Path

import keras

from keras_attn import patterns
from keras_attn.kernels import KERNELS
from keras_attn.kernels import cost
from keras_attn.kernels.call import AttentionCall
from keras_attn.validation import check_bool
from keras_attn.validation import check_position
from keras_attn.validation import check_rate

KERAS_DENSE = "keras_dense"  # Keras's layer: the memory ceiling, modelled like a kernel
MODES = ("forward", "training")
SHIPPED_CALIBRATION = Path(__file__).with_name("calibration.json")
CACHE_ENV = "KERAS_ATTN_CACHE"
CALIBRATION_FILE = "calibration.json"
ANALYTIC_MEMORY = dict.fromkeys(cost.MEMORY_FEATURES, 1.0)


def cache_dir():
    """The user's keras_attn cache directory: `$KERAS_ATTN_CACHE`, else `~/.cache/keras_attn`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "keras_attn")


def user_calibration_path():
    """Where `keras_attn.tune()` stores the user's calibration (inside `cache_dir()`)."""
    return cache_dir() / CALIBRATION_FILE


@functools.lru_cache(maxsize=1)
def calibration():
    """The calibration in use: the shipped one, each entry overridden by the user's (when present)."""
    merged = json.loads(SHIPPED_CALIBRATION.read_text(encoding="utf-8"))
    path = user_calibration_path()
    if path.is_file():
        user = json.loads(path.read_text(encoding="utf-8"))
        for part in ("time", "memory"):
            merged[part] = {**merged[part], **user.get(part, {})}
        merged["source"] = str(path)
    else:
        merged["source"] = str(SHIPPED_CALIBRATION)
    return merged


def reload_calibration():
    """Forgets the calibration read and the choices made from it (after a new calibration is written)."""
    calibration.cache_clear()
    _CHOICES.clear()


def kernel_features(name, call):
    """The `keras_attn.kernels.cost.Features` of `call` on kernel `name` of the registry, or on
    Keras's layer (`KERAS_DENSE`: the dense kernel's tensors, in the call's compute dtype)."""
    if name == KERAS_DENSE:
        return cost.materialised(call, cost.itemsize_of(call.query.dtype))
    return KERNELS[name].cost_features(call)


def memory_model(name, features):
    """Whose memory coefficients predict kernel `name`'s bytes: Keras's layer's for a kernel holding
    its tensors (`features.materialised`; the dense kernel, in float32), else the kernel's own."""
    return KERAS_DENSE if features.materialised else name


def mode_of(call):
    return "training" if call.training else "forward"


def predict(name, call, part, features=None):
    """Predicted seconds (`part="time"`) or peak bytes (`part="memory"`) of `call` on `name`."""
    features = features or kernel_features(name, call)
    if part == "memory":  # no memory measured (small grids): every tensor counted is held once
        model = memory_model(name, features)
        coefficients = calibration()["memory"].get(model, {}).get(mode_of(call), ANALYTIC_MEMORY)
    else:
        coefficients = calibration()["time"][name][mode_of(call)]
    values = features.time if part == "time" else features.memory
    return max(0.0, sum(coefficients.get(feature, 0.0) * value for feature, value in values.items()))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One kernel's verdict for a call: `unsupported` (its `why_unsupported` reason) or its
    predictions (`seconds`, `peak_bytes`; `None` when the lengths are unknown), the steps it
    unrolls into the graph (`unrolled_steps`; `None` for a kernel looping in the graph), and
    `why_not`, why `"auto"` did not take it (`None` for the chosen kernel)."""

    name: str
    unsupported: object
    seconds: object
    peak_bytes: object
    unrolled_steps: object
    admissible: bool
    why_not: object


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `"auto"` chose for a call (`chosen`), the peak predicted for Keras's dense attention
    (`keras_peak_bytes`), every kernel's `Candidate` in registry order, and the calibration used."""

    chosen: str
    keras_peak_bytes: object
    candidates: tuple
    mode: str
    calibration: str

    def __str__(self):
        keras_peak = "unknown" if self.keras_peak_bytes is None else _megabytes(self.keras_peak_bytes)
        lines = [
            f"implementation='auto' chooses {self.chosen!r} ({self.mode}; Keras's dense attention: {keras_peak}; "
            f"calibration {self.calibration})",
        ]
        for candidate in self.candidates:
            predicted = (
                ""
                if candidate.seconds is None
                else f"{candidate.seconds * 1e3:.3g} ms, {_megabytes(candidate.peak_bytes)}: "
            )
            verdict = "chosen" if candidate.why_not is None else candidate.why_not
            lines.append(f"  {candidate.name}: {predicted}{verdict}")
        return "\n".join(lines)


def _megabytes(count):
    return f"{count / 2**20:.3g} MB"


def explain(call):
    """The `Explanation` of `"auto"`'s choice for an `AttentionCall` (uncached)."""
    reasons = {name: module.why_unsupported(call) for name, module in KERNELS.items()}
    takers = [name for name, reason in reasons.items() if not reason]
    if call.query.shape[1] is None or call.key.shape[1] is None:
        return _explained(
            takers[0],
            reasons,
            {},
            None,
            call,
            "lengths unknown: no prediction, the first kernel taking it is",
            {},
            set(),
        )
    keras_peak = predict(KERAS_DENSE, call, "memory")
    predictions, unrolled, untraceable = {}, {}, set()
    for name in takers:
        features = kernel_features(name, call)
        predictions[name] = (predict(name, call, "time", features), predict(name, call, "memory", features))
        if features.unrolled:
            unrolled[name] = int(features.time["steps"])
        if cost.unrolls_too_many_steps(features):
            untraceable.add(name)
    traceable = [name for name in takers if name not in untraceable]
    admissible = [name for name in traceable if predictions[name][1] <= keras_peak]
    if admissible:
        chosen = min(admissible, key=lambda name: predictions[name][0])
    else:
        chosen = min(traceable, key=lambda name: predictions[name][1])
    return _explained(chosen, reasons, predictions, keras_peak, call, None, unrolled, untraceable)


def _explained(chosen, reasons, predictions, keras_peak, call, unpredicted, unrolled, untraceable):
    candidates = []
    for name, reason in reasons.items():
        seconds, peak = predictions.get(name, (None, None))
        admissible = not reason and name not in untraceable and (keras_peak is None or peak <= keras_peak)
        candidates.append(
            Candidate(
                name=name,
                unsupported=reason,
                seconds=seconds,
                peak_bytes=peak,
                unrolled_steps=unrolled.get(name),
                admissible=admissible,
                why_not=None
                if name == chosen
                else _why_not(
                    name, reason, seconds, peak, chosen, predictions, keras_peak, unpredicted, unrolled, untraceable
                ),
            )
        )
    return Explanation(
        chosen=chosen,
        keras_peak_bytes=keras_peak,
        candidates=tuple(candidates),
        mode=mode_of(call),
        calibration=calibration()["source"],
    )


def _why_not(name, reason, seconds, peak, chosen, predictions, keras_peak, unpredicted, unrolled, untraceable):
    if reason:
        return f"unsupported: needs {reason}"
    if unpredicted:
        return f"{unpredicted} {chosen!r}"
    if name in untraceable:
        return (
            f"unrolls {unrolled[name]} steps into the graph, more than {cost.MAX_UNROLLED_STEPS} "
            "(its tracing grows with them)"
        )
    if peak > keras_peak:
        return f"predicted peak {_megabytes(peak)} exceeds Keras's dense {_megabytes(keras_peak)}"
    chosen_seconds = predictions[chosen][0]
    return f"predicted slower than {chosen!r} ({seconds * 1e3:.3g} ms > {chosen_seconds * 1e3:.3g} ms)"


def choose(call):
    """The name of the kernel `"auto"` takes for an `AttentionCall`: `explain(call).chosen`, cached per `signature`."""
    key = signature(call)
    if key not in _CHOICES:
        _CHOICES[key] = explain(call).chosen
    return _CHOICES[key]


_CHOICES = {}  # signature -> chosen kernel, for the calibration in use


def signature(call):
    """A hashable key of everything the kernels' support and features read from a call."""

    def shape(tensor):
        return None if tensor is None else tuple(tensor.shape)

    return (
        keras.backend.backend(),
        shape(call.query),
        shape(call.key),
        shape(call.value),
        keras.backend.standardize_dtype(call.query.dtype),
        keras.backend.standardize_dtype(call.value.dtype),
        shape(call.mask),
        shape(call.bias),
        None
        if call.pattern is None
        else json.dumps(keras.saving.serialize_keras_object(call.pattern), sort_keys=True, default=str),
        call.query_offset
        if isinstance(call.query_offset, int) and not isinstance(call.query_offset, bool)
        else "tensor",
        call.dropout_rate > 0.0,
        call.training,
        call.return_weights,
        call.hard,
        call.position_bias is not None,
        shape(call.query_segment_ids),
    )


def explain_implementation(
    query_shape,
    key_shape=None,
    value_shape=None,
    *,
    dtype="float32",
    is_causal=False,
    sliding_window=None,
    pattern=None,
    query_offset=0,
    dropout_rate=0.0,
    training=False,
    return_weights=False,
    hard=False,
    mask_shape=None,
    bias_shape=None,
    packed=False,
):
    """What `scaled_dot_product_attention(..., implementation="auto")` would run for a call, and why.

    The arguments describe the call as `scaled_dot_product_attention` takes it, by shapes instead
    of tensors. For every kernel of `keras_attn.kernels.KERNELS` the result gives its predicted
    time and peak memory (`None` when the lengths are unknown), whether it is admissible (takes the
    call and is predicted to hold at most Keras's dense attention), and why `"auto"` did not take
    it: the kernel's own reason, a predicted peak above Keras's, or predicted slower than the
    chosen one. `print()` it for a table.

    Args:
        query_shape: `(batch, query_len, heads, depth)`; `None` for an unknown size.
        key_shape: `(batch, key_len, kv_heads, depth)`; defaults to `query_shape`.
        value_shape: `(batch, key_len, kv_heads, value_depth)`; defaults to `key_shape`.
        dtype: the compute dtype of query, key and value (a float dtype).
        is_causal: as for `scaled_dot_product_attention`.
        sliding_window: as for `scaled_dot_product_attention`.
        pattern: as for `scaled_dot_product_attention`.
        query_offset: as for `scaled_dot_product_attention`.
        dropout_rate: as for `scaled_dot_product_attention`.
        training: as for `scaled_dot_product_attention`.
        return_weights: as for `scaled_dot_product_attention`.
        hard: as for `scaled_dot_product_attention`.
        mask_shape: the shape of a boolean `mask`, or `None` for none.
        bias_shape: the shape of an additive `bias`, or `None` for none.
        packed: whether the call has segment ids (packed rows).

    Returns:
        An `Explanation`: `chosen`, `keras_peak_bytes`, and `candidates` (one `Candidate` per
        kernel of the registry, in its order).

    Example:

    >>> explanation = explain_implementation((1, 4096, 8, 64), is_causal=True, training=True)
    >>> [candidate.name for candidate in explanation.candidates]
    ['dense', 'chunked', 'blockwise', 'strided']
    >>> explain_implementation((1, 4096, 8, 64), return_weights=True).chosen  # the only kernel returning weights
    'dense'
    """
    key_shape = query_shape if key_shape is None else key_shape
    value_shape = key_shape if value_shape is None else value_shape
    shapes = {"query_shape": query_shape, "key_shape": key_shape, "value_shape": value_shape}
    for name, shape in shapes.items():
        _check_shape(name, shape)
    for name, shape in (("mask_shape", mask_shape), ("bias_shape", bias_shape)):
        if shape is not None:
            _check_shape(name, shape)
    query_heads, key_heads = query_shape[2], key_shape[2]
    if query_heads is not None and key_heads is not None and query_heads % key_heads:
        raise ValueError(
            "The heads of `query_shape` must be a multiple of those of `key_shape`. "
            f"Received: query_shape={tuple(query_shape)}, key_shape={tuple(key_shape)}"
        )
    if tuple(key_shape)[:3] != tuple(value_shape)[:3]:
        raise ValueError(
            "`key_shape` and `value_shape` must agree on batch, length and heads. "
            f"Received: key_shape={tuple(key_shape)}, value_shape={tuple(value_shape)}"
        )
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:
        dtype = None
    if dtype is None or "float" not in dtype:
        raise ValueError(f"`dtype` must be a float dtype. Received: dtype={dtype!r}")
    check_rate("dropout_rate", dropout_rate)
    for name, value in (
        ("is_causal", is_causal),
        ("training", training),
        ("return_weights", return_weights),
        ("hard", hard),
        ("packed", packed),
    ):
        check_bool(name, value)
    check_position("query_offset", query_offset)
    batch, query_len = query_shape[0], query_shape[1]
    key_len = key_shape[1]
    heads_shape = (batch, key_len, query_heads, key_shape[3])
    return explain(
        AttentionCall(
            query=keras.KerasTensor(tuple(query_shape), dtype),
            key=keras.KerasTensor(heads_shape, dtype),
            value=keras.KerasTensor((batch, key_len, query_heads, value_shape[3]), dtype),
            mask=None if mask_shape is None else keras.KerasTensor(tuple(mask_shape), "bool"),
            bias=None if bias_shape is None else keras.KerasTensor(tuple(bias_shape), dtype),
            pattern=patterns.from_shorthands(pattern, is_causal, sliding_window),
            query_offset=query_offset,
            dropout_rate=dropout_rate if training else 0.0,
            return_weights=return_weights,
            hard=hard,
            query_segment_ids=keras.KerasTensor((batch, query_len), "int32") if packed else None,
            key_segment_ids=keras.KerasTensor((batch, key_len), "int32") if packed else None,
            training=training,
        )
    )


def _check_shape(name, shape):
    if (
        isinstance(shape, (str, bytes))
        or not hasattr(shape, "__len__")
        or len(shape) != 4
        or not all(
            size is None or (isinstance(size, int) and not isinstance(size, bool) and size > 0) for size in shape
        )
    ):
        raise ValueError(f"`{name}` must be 4 positive ints or `None`s. Received: {name}={shape!r}")
