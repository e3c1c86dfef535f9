"""What `implementation="auto"` chooses, and why: each kernel's time, measured or predicted, and its
predicted peak memory.

Each kernel of the registry (`keras_attn.kernels.KERNELS`) turns a call into the features of
`keras_attn.kernels.cost` (the pairs it computes, its loop steps, the pairwise values it holds);
a calibration gives, per kernel and per mode (`"forward"`, or `"training"`: forward and backward),
one coefficient per feature, so that a prediction is a dot product: seconds for the time features,
bytes for the memory features. Keras's own layer is modelled the same way (`KERAS_DENSE`: its
logits, softmax weights and dropout in the compute dtype), as the memory ceiling:

- the candidates are the kernels that take the call (`why_unsupported(call)` is `None`);
- the admissible ones are predicted to hold at most Keras's dense attention's peak for the call,
  and unroll at most `cost.MAX_UNROLLED_STEPS` steps into the graph;
- the contenders are the admissible ones predicted within `PRUNE_FACTOR` of the fastest
  prediction (the calibration prunes, it does not decide);
- the contenders' times are measured (`keras_attn.dispatch.measuring`: once per bucket of call
  signatures, kept in memory and in the user's cache directory) unless measuring is off
  (`set_measured_dispatch(False)` or `KERAS_ATTN_MEASURE=0`: then the predicted times stand in);
- `"auto"` takes, among the contenders whose time is within `tie_tolerance()` (10 % by default)
  of the fastest, the one predicted lightest; when no kernel is admissible, the candidate predicted
  lightest among those unrolling no more (the dense kernel is one step). With an unknown query or
  key length there is nothing to measure or predict: the first candidate of the registry (dense).

The calibration is `calibration.json` beside this module (fitted by `benchmarks/dispatch_grid.py`,
shipped with the package) unless `keras_attn.tune()` stored one in the user's cache directory
(`$KERAS_ATTN_CACHE`, else `~/.cache/keras_attn`), whose entries then take precedence; a user file
that is corrupt, of another format or environment, or holds a coefficient that is not a finite
number >= 0, is ignored with a warning (`keras_attn.dispatch.state`). The choice is kept per call
signature and settings, so it is deterministic for a signature within a process.
"""

import dataclasses
import functools
import json
import os
import warnings
from pathlib import Path

import keras

from keras_attn.dispatch import measuring
from keras_attn.dispatch import state
from keras_attn.dispatch.arguments import checked_pattern
from keras_attn.dispatch.signatures import signature
from keras_attn.kernels import KERNELS
from keras_attn.kernels import cost
from keras_attn.kernels.call import AttentionCall
from keras_attn.validation import MAX_ELEMENTS
from keras_attn.validation import check_bool
from keras_attn.validation import check_number

KERAS_DENSE = "keras_dense"  # Keras's layer: the memory ceiling, modelled like a kernel
MODES = ("forward", "training")
SHIPPED_CALIBRATION = Path(__file__).with_name("calibration.json")
CACHE_ENV = state.CACHE_ENV
CALIBRATION_FILE = "calibration.json"
ANALYTIC_MEMORY = dict.fromkeys(cost.MEMORY_FEATURES, 1.0)
# A kernel predicted slower than this many times the fastest prediction is not measured: the
# calibration's errors are well under it, so such a kernel cannot win.
PRUNE_FACTOR = 3.0
MEASURE_ENV = "KERAS_ATTN_MEASURE"  # "0" (or false/no/off): the predictions decide, nothing is measured
TIE_TOLERANCE_ENV = "KERAS_ATTN_TIE_TOLERANCE"
DEFAULT_TIE_TOLERANCE = 0.1
_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on")
_settings = {"measure": None, "tie_tolerance": None}  # None: the environment variable, else the default


def set_measured_dispatch(enabled=None, *, tie_tolerance=None):
    """Turns the measured choice of `implementation="auto"` on or off, and sets its tie tolerance.

    With measuring on (the default), the first call of each bucket of call signatures times the
    kernels that could win (`keras_attn.dispatch.measuring`) and `"auto"` takes the fastest, or the
    lightest of those within `tie_tolerance` of it; the times are kept in the user's cache directory
    (`$KERAS_ATTN_CACHE`, else `~/.cache/keras_attn`). With measuring off, the calibration's
    predicted times stand in (reproducible across machines and runs). Each setting given here takes
    precedence over its environment variable (`KERAS_ATTN_MEASURE=0`, `KERAS_ATTN_TIE_TOLERANCE`);
    the choices already made are forgotten.

    Args:
        enabled: whether `"auto"` measures (bool); `None` leaves it (`KERAS_ATTN_MEASURE`, else on).
        tie_tolerance: the fraction (a number >= 0, default 0.1) within which a kernel's time counts
            as a tie with the fastest, the lighter kernel then taken; `None` leaves it
            (`KERAS_ATTN_TIE_TOLERANCE`, else 0.1).

    Example:

    >>> set_measured_dispatch(False)  # reproducible runs: the calibration's predictions decide
    >>> measuring_enabled()
    False
    """
    if enabled is not None:
        _settings["measure"] = check_bool("enabled", enabled)
    if tie_tolerance is not None:
        _settings["tie_tolerance"] = check_number("tie_tolerance", tie_tolerance, at_least=0)
    _CHOICES.clear()


def measuring_enabled():
    """Whether `"auto"` measures: `set_measured_dispatch`'s setting, else `KERAS_ATTN_MEASURE`, else on."""
    if _settings["measure"] is not None:
        return _settings["measure"]
    value = os.environ.get(MEASURE_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in (*_ON, ""):
        return True
    raise ValueError(f"${MEASURE_ENV} must be one of {_OFF + _ON}. Received: {MEASURE_ENV}={value!r}")


def tie_tolerance():
    """The tie tolerance: `set_measured_dispatch`'s setting, else `KERAS_ATTN_TIE_TOLERANCE`, else 0.1."""
    if _settings["tie_tolerance"] is not None:
        return _settings["tie_tolerance"]
    value = os.environ.get(TIE_TOLERANCE_ENV, "").strip()
    if not value:
        return DEFAULT_TIE_TOLERANCE
    try:
        return check_number(TIE_TOLERANCE_ENV, float(value), at_least=0)
    except ValueError:
        raise ValueError(
            f"${TIE_TOLERANCE_ENV} must be a number >= 0. Received: {TIE_TOLERANCE_ENV}={value!r}"
        ) from None


def cache_dir():
    """The user's keras_attn cache directory (`keras_attn.dispatch.state.cache_dir`)."""
    return state.cache_dir()


def user_calibration_path():
    """Where `keras_attn.tune()` stores the user's calibration (inside `cache_dir()`)."""
    return cache_dir() / CALIBRATION_FILE


@functools.lru_cache(maxsize=1)
def calibration():
    """The calibration in use: the shipped one, each entry overridden by the user's when it is valid
    (`calibration_problem`; an invalid one is ignored with a warning naming its path)."""
    merged = json.loads(SHIPPED_CALIBRATION.read_text(encoding="utf-8"))
    path = user_calibration_path()
    user = state.read(path, calibration_problem)
    if user is not None:
        for part in ("time", "memory"):
            merged[part] = {**merged[part], **user.get(part, {})}
        merged["source"] = str(path)
    else:
        merged["source"] = str(SHIPPED_CALIBRATION)
    return merged


def calibration_problem(payload):
    """Why a calibration's coefficients cannot be used (a part that is not a mapping, an unknown
    kernel, mode or feature, a coefficient that is not a finite number >= 0), or `None`."""
    for part, names, features in (
        ("time", tuple(KERNELS), cost.TIME_FEATURES),
        ("memory", (*KERNELS, KERAS_DENSE), cost.MEMORY_FEATURES),
    ):
        section = payload.get(part, {})
        if not isinstance(section, dict):
            return f"`{part}` is not a mapping"
        for name, modes in section.items():
            if name not in names or not isinstance(modes, dict) or not set(modes) <= set(MODES):
                return f"`{part}` holds {name!r}: {modes!r}, not a mapping of {MODES} for a kernel of {names}"
            for mode, coefficients in modes.items():
                if not isinstance(coefficients, dict) or not set(coefficients) <= set(features):
                    return f"{part}.{name}.{mode} is {coefficients!r}, not a mapping of {features}"
                for feature, value in coefficients.items():
                    problem = state.nonnegative_number_problem(f"{part}.{name}.{mode}.{feature}", value)
                    if problem:
                        return problem
    return None


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
    predictions (`seconds`, `peak_bytes`; `None` when the lengths are unknown), its measured time
    (`measured_seconds`; `None` when it was not measured), the steps it unrolls into the graph
    (`unrolled_steps`; `None` for a kernel looping in the graph), whether it is `admissible`, and
    `why_not`, why `"auto"` did not take it (`None` for the chosen kernel)."""

    name: str
    unsupported: object
    seconds: object
    peak_bytes: object
    unrolled_steps: object
    admissible: bool
    why_not: object
    measured_seconds: object = None


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `"auto"` chose for a call (`chosen`), the peak predicted for Keras's dense attention
    (`keras_peak_bytes`), every kernel's `Candidate` in registry order, the calibration used, and
    where the times compared came from (`timing`: `"measured now"`, `"cache file <path>"`,
    `"memory"` (measured earlier in this process), or `"predicted (<why>)"`)."""

    chosen: str
    keras_peak_bytes: object
    candidates: tuple
    mode: str
    calibration: str
    timing: str = "predicted"

    def __str__(self):
        keras_peak = "unknown" if self.keras_peak_bytes is None else _megabytes(self.keras_peak_bytes)
        lines = [
            f"implementation='auto' chooses {self.chosen!r} ({self.mode}; Keras's dense attention: {keras_peak}; "
            f"calibration {self.calibration}; times {self.timing})",
        ]
        for candidate in self.candidates:
            predicted = (
                ""
                if candidate.seconds is None
                else f"predicted {_milliseconds(candidate.seconds)}, {_megabytes(candidate.peak_bytes)}: "
            )
            measured = (
                "" if candidate.measured_seconds is None else f"measured {_milliseconds(candidate.measured_seconds)}, "
            )
            verdict = "chosen" if candidate.why_not is None else candidate.why_not
            lines.append(f"  {candidate.name}: {measured}{predicted}{verdict}")
        return "\n".join(lines)


def _megabytes(count):
    return f"{count / 2**20:.3g} MB"


def _milliseconds(seconds):
    return f"{seconds * 1e3:.3g} ms"


def explain(call):
    """The `Explanation` of `"auto"`'s choice for an `AttentionCall` (measuring its contenders when
    measuring is on and they are not measured yet; the choice itself uncached)."""
    reasons = {name: module.why_unsupported(call) for name, module in KERNELS.items()}
    takers = [name for name, reason in reasons.items() if not reason]
    if call.query.shape[1] is None or call.key.shape[1] is None:
        why_not = {name: reason and f"unsupported: needs {reason}" for name, reason in reasons.items()}
        for name in takers[1:]:
            why_not[name] = f"lengths unknown: no prediction, the first kernel taking it is {takers[0]!r}"
        return _explanation(call, takers[0], reasons, why_not, timing="predicted (lengths unknown)")
    keras_peak = predict(KERAS_DENSE, call, "memory")
    predictions, unrolled, why_not = {}, {}, {}
    for name in takers:
        features = kernel_features(name, call)
        predictions[name] = (predict(name, call, "time", features), predict(name, call, "memory", features))
        if features.unrolled:
            unrolled[name] = int(features.time["steps"])
        if cost.unrolls_too_many_steps(features):
            why_not[name] = (
                f"unrolls {unrolled[name]} steps into the graph, more than {cost.MAX_UNROLLED_STEPS} "
                "(its tracing grows with them)"
            )
    traceable = [name for name in takers if name not in why_not]
    for name in traceable:
        if predictions[name][1] > keras_peak:
            why_not[name] = (
                f"predicted peak {_megabytes(predictions[name][1])} exceeds Keras's dense {_megabytes(keras_peak)}"
            )
    admissible = [name for name in traceable if name not in why_not]
    measured, timing = {}, "predicted (no kernel is admissible: the lightest is taken)"
    if admissible:
        contenders, pruned = _contenders(admissible, predictions)
        why_not.update(pruned)
        seconds, timing = _times(call, contenders, predictions)
        if not timing.startswith("predicted"):
            measured = seconds
        chosen = _near_tie_choice(seconds, predictions)
        why_not.update(_why_not_contenders(contenders, chosen, seconds, predictions, bool(measured)))
    else:
        chosen = min(traceable, key=lambda name: predictions[name][1])
    for name, reason in reasons.items():
        if reason:
            why_not[name] = f"unsupported: needs {reason}"
    why_not.pop(chosen, None)
    return _explanation(call, chosen, reasons, why_not, predictions, keras_peak, unrolled, admissible, measured, timing)


def _contenders(admissible, predictions):
    """The admissible kernels worth timing (predicted within `PRUNE_FACTOR` of the fastest
    prediction), and `{kernel: why not}` of the others."""
    fastest = min(predictions[name][0] for name in admissible)
    contenders = [name for name in admissible if predictions[name][0] <= PRUNE_FACTOR * fastest]
    pruned = {
        name: f"predicted {_milliseconds(predictions[name][0])}, more than {PRUNE_FACTOR:g}x the fastest "
        f"prediction ({_milliseconds(fastest)}): not a contender"
        for name in admissible
        if name not in contenders
    }
    return contenders, pruned


def _times(call, contenders, predictions):
    """`({kernel: seconds}, timing)`: the contenders' measured times when measuring is on and there
    is a choice to make, else their predicted times; a measurement that fails (whatever the reason)
    falls back to the predictions with one warning."""
    predicted = {name: predictions[name][0] for name in contenders}
    if len(contenders) < 2:
        return predicted, "predicted (one contender: nothing to measure)"
    if not measuring_enabled():
        return predicted, f"predicted (measuring off: {MEASURE_ENV}=0 or set_measured_dispatch(False))"
    try:
        return measuring.measured_seconds(call, contenders)
    except Exception as error:  # a measurement must never break a model: the prediction decides
        message = f"{type(error).__name__}: {error}"
        if message not in _failures_warned:
            _failures_warned.add(message)
            warnings.warn(
                f"keras_attn could not measure the kernels ({message}); the predictions decide.", stacklevel=3
            )
        return predicted, f"predicted (measuring failed: {message})"


_failures_warned = set()


def _near_tie_choice(seconds, predictions):
    """The lightest (predicted peak bytes) of the kernels whose time is within `tie_tolerance()` of
    the fastest: a few percent of speed are not worth a multiple of the memory."""
    fastest = min(seconds.values())
    tied = [name for name in seconds if seconds[name] <= fastest * (1 + tie_tolerance())]
    return min(tied, key=lambda name: (predictions[name][1], seconds[name]))


def _why_not_contenders(contenders, chosen, seconds, predictions, measured):
    how = "measured" if measured else "predicted"
    reasons = {}
    for name in contenders:
        if name == chosen:
            continue
        if seconds[name] <= min(seconds.values()) * (1 + tie_tolerance()):
            reasons[name] = (
                f"{how} {_milliseconds(seconds[name])}, within {tie_tolerance():.0%} of the fastest, but predicted "
                f"heavier than {chosen!r} ({_megabytes(predictions[name][1])} > {_megabytes(predictions[chosen][1])})"
            )
        else:
            reasons[name] = (
                f"{how} slower than {chosen!r} ({_milliseconds(seconds[name])} > {_milliseconds(seconds[chosen])})"
            )
    return reasons


def _explanation(
    call,
    chosen,
    reasons,
    why_not,
    predictions=None,
    keras_peak=None,
    unrolled=None,
    admissible=(),
    measured=None,
    timing="predicted",
):
    predictions, unrolled, measured = predictions or {}, unrolled or {}, measured or {}
    candidates = tuple(
        Candidate(
            name=name,
            unsupported=reason,
            seconds=predictions.get(name, (None, None))[0],
            peak_bytes=predictions.get(name, (None, None))[1],
            unrolled_steps=unrolled.get(name),
            admissible=name in admissible or (keras_peak is None and not reason),
            why_not=why_not.get(name),
            measured_seconds=measured.get(name),
        )
        for name, reason in reasons.items()
    )
    return Explanation(
        chosen=chosen,
        keras_peak_bytes=keras_peak,
        candidates=candidates,
        mode=mode_of(call),
        calibration=calibration()["source"],
        timing=timing,
    )


def choose(call):
    """The name of the kernel `"auto"` takes for an `AttentionCall`: `explain(call).chosen`, kept
    per signature and settings (deterministic for a signature within a process)."""
    key = (signature(call), measuring_enabled(), tie_tolerance())
    if key not in _CHOICES:
        _CHOICES[key] = explain(call).chosen
    return _CHOICES[key]


_CHOICES = {}  # (signature, measuring on, tie tolerance) -> chosen kernel, for the calibration in use


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
    of tensors, and are checked as it checks them (the same `ValueError`s). The contenders are
    measured as `"auto"` measures them (unless measuring is off, `set_measured_dispatch`), so the
    answer is what the call would run. For every kernel of `keras_attn.kernels.KERNELS` the result
    gives its measured time (`None` when not measured), its predicted time and peak memory (`None`
    when the lengths are unknown), whether it is admissible (takes the call and is predicted to
    hold at most Keras's dense attention), and why `"auto"` did not take it: the kernel's own
    reason, a predicted peak above Keras's, not a contender (predicted more than `PRUNE_FACTOR`
    times slower), slower than the chosen one, or within the tie tolerance but heavier; and where
    the times came from (`timing`). `print()` it for a table.

    Args:
        query_shape: `(batch, query_len, heads, depth)`, ints up to 2**31 - 1; `None` for an
            unknown size.
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
        An `Explanation`: `chosen`, `keras_peak_bytes`, `timing`, and `candidates` (one
        `Candidate` per kernel of the registry, in its order).

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
    check_bool("packed", packed)
    query, key, value = (keras.KerasTensor(tuple(shape), dtype) for shape in (query_shape, key_shape, value_shape))
    mask = None if mask_shape is None else keras.KerasTensor(tuple(mask_shape), "bool")
    bias = None if bias_shape is None else keras.KerasTensor(tuple(bias_shape), dtype)
    pattern = checked_pattern(  # what `scaled_dot_product_attention` refuses, refused alike
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        sliding_window=sliding_window,
        query_offset=query_offset,
        scale=None,
        dropout_rate=dropout_rate,
        training=training,
        return_weights=return_weights,
        pattern=pattern,
        hard=hard,
        logit_soft_cap=None,
    )
    batch, query_len, query_heads = query_shape[:3]
    key_len = key_shape[1]
    return explain(
        AttentionCall(
            query=query,
            key=keras.KerasTensor((batch, key_len, query_heads, key_shape[3]), dtype),
            value=keras.KerasTensor((batch, key_len, query_heads, value_shape[3]), dtype),
            mask=mask,
            bias=bias,
            pattern=pattern,
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
            size is None or (isinstance(size, int) and not isinstance(size, bool) and 0 < size <= MAX_ELEMENTS)
            for size in shape
        )
    ):
        raise ValueError(
            f"`{name}` must be 4 positive ints of at most {MAX_ELEMENTS} (int32: TensorFlow's sizes) or `None`s. "
            f"Received: {name}={shape!r}"
        )
