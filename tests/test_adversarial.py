"""The adversarial suite: valid and invalid calls of the public surfaces, drawn by hypothesis from the
specs of `keras_attn.contracts`, each outcome one of `OUTCOMES`.

A valid call is drawn across its whole allowed range (lengths 0, 1 and odd, scales and soft caps
from 1e-30 to 1e30, float16/float32/float64 inputs, every kernel of `keras_attn.kernels.KERNELS`
and `"auto"`, eager, `tf.function` and XLA) and compared with the float64 reference
(tests/reference.py) or Keras's layer holding the same weights: `right`, or `silent wrong`. A call
a kernel cannot take is refused naming the argument: `clear error`. An invalid call (a value outside
its spec, drawn from the spec's kind) must raise a `ValueError`/`TypeError` naming the argument and
quoting what was received before any TensorFlow op runs: `clear error`; accepted it is `silent
wrong`, refused otherwise `unclear`.

In CI (the default) each property runs a fixed, small, derandomized set of examples
(`ci` profile). `make fuzz FUZZ_MINUTES=30` sets `KERAS_ATTN_FUZZ_MINUTES`: each property then draws
random examples for its share of the time, hypothesis printing each minimal failing example, and the
counts per surface and outcome are printed and written to `KERAS_ATTN_FUZZ_RESULTS`
(benchmarks/results/fuzz.json by default).
"""

import collections
import json
import math
import os
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from tensorflow.python.framework import op_callbacks

import keras_attn
from keras_attn import contracts
from keras_attn.kernels import KERNELS
from tests import reference
from tests.test_argument_validation import REQUIRED
from tests.test_contracts import SCALAR_SURFACES
from tests.test_contracts import _documents
from tests.test_contracts import _surfaces

FUZZ_MINUTES = float(os.environ.get("KERAS_ATTN_FUZZ_MINUTES") or 0)
RESULTS_PATH = Path(
    os.environ.get("KERAS_ATTN_FUZZ_RESULTS")
    or Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "fuzz.json"
)
OUTCOMES = ("right", "clear error", "silent wrong", "unclear")
COUNTS = collections.defaultdict(collections.Counter)
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", derandomize=True, database=None, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("fuzz", derandomize=False, database=None, deadline=None, suppress_health_check=_HEALTH)
PROFILE = "fuzz" if FUZZ_MINUTES else "ci"
PROPERTIES = 7  # the properties below, which share the fuzzing time


def fuzzed(ci_examples):
    """Runs a `@given` property with `ci_examples` derandomized examples in CI, or, fuzzing, with new
    random examples for its share of `FUZZ_MINUTES`, reporting every minimal failing example."""

    def decorate(property_test):
        def run():
            if not FUZZ_MINUTES:
                settings(settings.get_profile(PROFILE), max_examples=ci_examples)(property_test)()
                return
            failures, stop = [], time.monotonic() + FUZZ_MINUTES * 60 / PROPERTIES
            batch = settings(settings.get_profile(PROFILE), max_examples=10)(property_test)  # the time checked every 10
            while time.monotonic() < stop:
                try:
                    batch()
                except Exception as failure:  # minimal failing examples: report each, draw on
                    for example in getattr(failure, "exceptions", [failure]):  # several distinct ones: a group
                        notes = "\n".join(getattr(example, "__notes__", []))
                        failures.append(f"{type(example).__name__}: {example}\n{notes}")
                        print(f"\n--- {property_test.__name__}\n{failures[-1]}", file=sys.__stdout__, flush=True)
            assert not failures, "\n\n".join(failures)

        run.__name__ = property_test.__name__
        return run

    return decorate


def record(surface, outcome):
    COUNTS[surface][outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    if not FUZZ_MINUTES:
        return
    table = {surface: {outcome: counts[outcome] for outcome in OUTCOMES} for surface, counts in sorted(COUNTS.items())}
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps({"minutes": FUZZ_MINUTES, "counts": table}, indent=2) + "\n")
    lines = [f"{'surface':48} " + " ".join(f"{outcome:>13}" for outcome in OUTCOMES)]
    lines += [f"{surface:48} " + " ".join(f"{row[o]:>13}" for o in OUTCOMES) for surface, row in table.items()]
    print("\n" + "\n".join(lines) + f"\n(written to {RESULTS_PATH})", file=sys.__stdout__, flush=True)


class _OpCounter:
    """Counts the TensorFlow ops run (eager) or built (graph) while it is entered."""

    def __enter__(self):
        self.ops = []
        self._callback = lambda op_type, *args, **kwargs: self.ops.append(op_type)
        op_callbacks.add_op_callback(self._callback)
        return self

    def __exit__(self, *exc):
        op_callbacks.remove_op_callback(self._callback)


def _shown(value):
    """The ways an error may quote `value`."""
    texts = {repr(value), str(value)}
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        texts.add(str(int(value)))
    return texts


def expect_clear_error(surface, argument, value, call):
    """`call()` must raise a `ValueError`/`TypeError` naming `argument` and quoting `value` (or its shape
    or dtype, for a tensor) before any TensorFlow op: records the outcome and fails on any other."""
    with _OpCounter() as counter:
        try:
            call()
        except (ValueError, TypeError) as error:
            message = str(error)
            quoted = "Received" in message or any(text in message for text in _shown(value))
            if argument in message and quoted and not counter.ops:
                record(surface, "clear error")
                return
            record(surface, "unclear")
            ran = f" after {len(counter.ops)} TensorFlow ops ({counter.ops[:3]})" if counter.ops else ""
            raise AssertionError(
                f"unclear refusal of {argument}={value!r}{ran}: {type(error).__name__}: {message}"
            ) from error
        except Exception as error:
            record(surface, "unclear")
            raise AssertionError(f"{argument}={value!r} raised {type(error).__name__}: {error}") from error
    record(surface, "silent wrong")
    raise AssertionError(f"{surface} accepted {argument}={value!r}")


# Bad values of each scalar kind: every class of value the spec's check must refuse.
_ANY_TEXT = st.sampled_from(["", "1", "true", "auto ", "None"])
_NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_BOOLS = st.sampled_from([True, False, np.bool_(True)])
_TOO_BIG = st.integers(2**31, 2**70)
_BAD = {
    "bool": st.one_of(_ANY_TEXT, st.integers(), st.floats(), st.none()),
    "bool_or_none": st.one_of(_ANY_TEXT, st.integers(), st.floats()),
    "truth_value": st.one_of(
        _ANY_TEXT, st.integers().filter(lambda value: value not in (0, 1)), st.floats(), st.none()
    ),
    "positive_int": st.one_of(
        st.integers(max_value=0), _TOO_BIG, st.floats(allow_nan=True), _ANY_TEXT, _BOOLS, st.none()
    ),
    "positive_int_or_none": st.one_of(st.integers(max_value=0), _TOO_BIG, st.floats(), _ANY_TEXT, _BOOLS),
    "rate": st.one_of(st.floats(max_value=-1e-300), st.floats(min_value=1.0), _NON_FINITE, _ANY_TEXT, _BOOLS),
    "rate_or_none": st.one_of(st.floats(max_value=-1e-300), st.floats(min_value=1.0), _NON_FINITE, _ANY_TEXT),
    "positive_number": st.one_of(st.floats(max_value=0.0), _NON_FINITE, _ANY_TEXT, _BOOLS, st.none()),
    "positive_number_or_none": st.one_of(
        st.floats(max_value=0.0), _NON_FINITE, st.floats(min_value=3.5e38), _ANY_TEXT, _BOOLS
    ),
    "non_negative_number_or_none": st.one_of(st.floats(max_value=-1e-300), _NON_FINITE, _ANY_TEXT, _BOOLS),
    "number_above_1": st.one_of(st.floats(max_value=1.0), _NON_FINITE, _ANY_TEXT, _BOOLS),
    "choice": st.one_of(st.text(max_size=12).filter(lambda text: text not in ("auto",)), _BOOLS, st.integers()),
    "position": st.one_of(st.integers(max_value=-1), _TOO_BIG, st.floats(), _ANY_TEXT, _BOOLS, st.none()),
    "axes": st.one_of(st.just(()), st.just([]), _ANY_TEXT, st.floats(allow_nan=False), st.tuples(st.floats())),
}


def _scalar_surfaces():
    """`(surface, function of keyword arguments, valid keyword arguments)`: every public layer's
    constructor (with what it needs) and the public functions with a valid call."""
    surfaces = [(f"{name}.__init__", getattr(keras_attn, name), required) for name, required in REQUIRED.items()]
    documents = _documents()  # made here: the ops building the data set are not the call's
    pack = ("packing.pack", lambda **args: keras_attn.packing.pack(documents, **args))
    return surfaces + [
        (*pack, valid) if surface == "packing.pack" else (surface, call, valid)
        for surface, call, valid in SCALAR_SURFACES
    ]


def _scalar_arguments():
    """`(surface, call, valid, argument, kind)` for every scalar argument of the scalar surfaces."""
    cases = []
    for surface, call, valid in _scalar_surfaces():
        names = set(valid) | set(_constructor_parameters(call) if isinstance(call, type) else ())
        for argument in sorted(names):
            argument_spec = contracts.spec(f"keras_attn.{surface}", argument)
            if argument_spec is not None and argument_spec.kind in _BAD:
                cases.append((surface, call, valid, argument, argument_spec))
    return cases


def _constructor_parameters(klass):
    return [
        name for surface, name in contracts.public_arguments() if surface == f"keras_attn.{klass.__name__}.__init__"
    ]


SCALAR_ARGUMENTS = _scalar_arguments()


def _is_valid(argument_spec, argument, value):
    """Whether the spec's own check takes `value` (a drawn bad value can be a valid one: `0.0` is a rate)."""
    try:
        contracts.CHECKS[argument_spec.check](argument_spec, argument, value)
    except (ValueError, TypeError):
        return False
    return True


@fuzzed(ci_examples=60)
@given(data=st.data())
def _invalid_scalar(data):
    surface, call, valid, argument, argument_spec = data.draw(st.sampled_from(SCALAR_ARGUMENTS), label="argument")
    bad = data.draw(_BAD[argument_spec.kind], label=argument)
    if argument_spec.kind == "choice":
        if bad in argument_spec.choices():
            return
    elif _is_valid(argument_spec, argument, bad):
        return
    expect_clear_error(surface, argument, bad, lambda: call(**{**valid, argument: bad}))


def test_an_invalid_scalar_argument_is_refused_clearly_before_any_op():
    _invalid_scalar()


# Valid calls of the core: `(batch, length, heads, depth)` inputs of small dyadic values, so that the
# float32 logits are exact and their order (the argmax at a huge scale) is the float64 reference's.
_SCALES = st.sampled_from([None, 1e-30, 1e-3, 0.5, 1.0, 7.0, 1e30])
_CAPS = st.sampled_from([None, 1e-30, 0.1, 5.0, 1e30])
_MODES = ("eager", "tf.function", "xla")
_DTYPES = ("float32", "float16", "float64")
_TOLERANCE = {"float32": 2e-5, "float16": 2e-2, "float64": 1e-9}


def _tensor(data, shape, dtype, label):
    values = data.draw(st.lists(st.integers(-4, 4), min_size=math.prod(shape), max_size=math.prod(shape)), label=label)
    return (np.array(values, "float64").reshape(shape) / 2).astype(dtype)


def _run(function, mode, *args):
    if mode == "eager":
        return function(*args)
    return tf.function(function, jit_compile=mode == "xla", reduce_retracing=False)(*args)


def _attention_call(data):
    batch = data.draw(st.integers(1, 2), label="batch")
    query_len = data.draw(st.sampled_from([0, 1, 2, 3, 5]), label="query_len")
    key_len = data.draw(st.sampled_from([0, 1, 3, 4, 7]), label="key_len")
    kv_heads = data.draw(st.integers(1, 2), label="kv_heads")
    heads = kv_heads * data.draw(st.integers(1, 2), label="groups")
    depth = data.draw(st.sampled_from([1, 2, 3]), label="depth")
    dtype = data.draw(st.sampled_from(_DTYPES), label="dtype")
    query = _tensor(data, (batch, query_len, heads, depth), dtype, "query")
    key = _tensor(data, (batch, key_len, kv_heads, depth), dtype, "key")
    value = _tensor(data, (batch, key_len, kv_heads, depth), dtype, "value")
    mask = None
    if data.draw(st.booleans(), label="with mask"):
        bits = data.draw(st.lists(st.booleans(), min_size=batch * key_len, max_size=batch * key_len), label="mask")
        mask = np.array(bits, bool).reshape(batch, 1, 1, key_len)
    options = dict(
        is_causal=data.draw(st.booleans(), label="is_causal"),
        sliding_window=data.draw(st.sampled_from([None, 1, 2, 3]), label="sliding_window"),
        scale=data.draw(_SCALES, label="scale"),
        logit_soft_cap=data.draw(_CAPS, label="logit_soft_cap"),
    )
    return (query, key, value, mask), options


def _reference(query, key, value, mask, options):
    output, _ = reference.attention(
        query,
        key,
        value,
        mask=mask,
        is_causal=options["is_causal"],
        sliding_window=options["sliding_window"],
        scale=options["scale"],
        soft_cap=options["logit_soft_cap"],
    )
    return output


def _compare(surface, actual, expected, dtype, description):
    actual = np.asarray(actual, "float64")
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    error = float(np.max(np.abs(actual - expected), initial=0.0)) / scale
    if actual.shape == expected.shape and error <= _TOLERANCE[dtype]:
        record(surface, "right")
        return
    record(surface, "silent wrong")
    raise AssertionError(f"{surface} {description}: shape {actual.shape} vs {expected.shape}, error {error:.3g}")


def _refused_clearly(surface, error, names):
    """A valid call a kernel cannot take: a `ValueError` naming one of the call's arguments is clear."""
    if isinstance(error, (ValueError, TypeError)) and any(name in str(error) for name in names):
        record(surface, "clear error")
        return
    record(surface, "unclear")
    raise AssertionError(f"{surface} raised {type(error).__name__}: {error}") from error


@fuzzed(ci_examples=6)
@given(data=st.data())
def _attention_against_reference(data):
    surface = "scaled_dot_product_attention"
    (query, key, value, mask), options = _attention_call(data)
    implementation = data.draw(st.sampled_from(["auto", *KERNELS]), label="implementation")
    mode = data.draw(st.sampled_from(_MODES), label="mode")

    def attend(q, k, v, m):
        return keras_attn.scaled_dot_product_attention(q, k, v, mask=m, implementation=implementation, **options)

    try:
        output = _run(attend, mode, query, key, value, mask)
    except Exception as error:
        _refused_clearly(surface, error, ["implementation", *options, "query", "key", "mask"])
        return
    expected = _reference(query.astype("float64"), key, value, mask, options)
    _compare(surface, output, expected, str(query.dtype), f"{implementation} {mode} {options}")


def test_scaled_dot_product_attention_matches_the_float64_reference():
    _attention_against_reference()


@fuzzed(ci_examples=4)
@given(data=st.data())
def _keras_signature_against_reference(data):
    surface = "ops.dot_product_attention"
    (query, key, value, mask), options = _attention_call(data)
    options.update(sliding_window=None)
    cap = options.pop("logit_soft_cap")
    mode = data.draw(st.sampled_from(_MODES), label="mode")

    def attend(q, k, v, m):
        return keras_attn.ops.dot_product_attention(
            q, k, v, mask=m, scale=options["scale"], is_causal=options["is_causal"], attn_logits_soft_cap=cap
        )

    try:
        output = _run(attend, mode, query, key, value, mask)
    except Exception as error:
        _refused_clearly(surface, error, ["query", "key", "mask", "scale", "attn_logits_soft_cap"])
        return
    expected = _reference(query.astype("float64"), key, value, mask, {**options, "logit_soft_cap": cap})
    expected = _keras_rows(expected, value, mask, options["is_causal"])
    _compare(surface, output, expected, str(query.dtype), f"{mode} {options} cap={cap}")


def _keras_rows(expected, value, mask, is_causal):
    """Keras's op gives a query with no allowed key the mean of the values (it softmaxes equal masked
    logits), and zeros when there are no keys at all (a sum over none)."""
    batch, query_len, heads = expected.shape[:3]
    key_len = value.shape[1]
    if key_len == 0:
        return expected
    allowed = np.ones((batch, query_len, key_len), bool)
    if mask is not None:
        allowed = allowed & mask[:, 0, 0][:, None, :]  # (batch, 1, 1, key_len) -> (batch, query_len, key_len)
    if is_causal:
        allowed = allowed & (np.arange(key_len)[None, :] <= np.arange(query_len)[:, None])
    has_key = allowed.any(-1)  # (batch, query_len)
    mean = np.repeat(value.astype("float64").mean(axis=1), heads // value.shape[2], axis=1)  # (batch, heads, depth)
    return np.where(has_key[:, :, None, None], expected, mean[:, None])


def test_the_keras_signature_matches_the_float64_reference():
    _keras_signature_against_reference()


@fuzzed(ci_examples=4)
@given(data=st.data())
def _layer_against_keras(data):
    surface = "MultiHeadAttention.call"
    num_heads = data.draw(st.integers(1, 3), label="num_heads")
    key_dim = data.draw(st.integers(1, 3), label="key_dim")
    value_dim = data.draw(st.sampled_from([None, 1, 2]), label="value_dim")
    batch = data.draw(st.integers(1, 2), label="batch")
    query_len = data.draw(st.sampled_from([1, 2, 5]), label="query_len")
    key_len = data.draw(st.sampled_from([1, 3, 4]), label="key_len")
    width = data.draw(st.integers(1, 4), label="width")
    use_causal_mask = data.draw(st.booleans(), label="use_causal_mask")
    mode = data.draw(st.sampled_from(_MODES), label="mode")
    config = dict(num_heads=num_heads, key_dim=key_dim, value_dim=value_dim)
    query = _tensor(data, (batch, query_len, width), "float32", "query")
    value = _tensor(data, (batch, key_len, width), "float32", "value")
    bits = data.draw(st.lists(st.booleans(), min_size=batch * key_len, max_size=batch * key_len), label="mask")
    mask = np.broadcast_to(np.array(bits, bool).reshape(batch, 1, key_len), (batch, query_len, key_len))
    theirs = keras.layers.MultiHeadAttention(**config)
    ours = keras_attn.MultiHeadAttention(**config)
    expected = np.asarray(theirs(query, value, attention_mask=mask, use_causal_mask=use_causal_mask), "float64")
    ours(query, value)
    ours.set_weights(theirs.get_weights())

    def attend(q, v, m):
        return ours(q, v, attention_mask=m, use_causal_mask=use_causal_mask)

    try:
        output = _run(attend, mode, query, value, mask)
    except Exception as error:
        _refused_clearly(surface, error, ["query", "value", "attention_mask", "use_causal_mask"])
        return
    # Keras's layer gives a query with no allowed key the mean of the values; ours gives zeros (the
    # contract): such rows are compared with the reference's zeros instead.
    allowed = mask & (np.tril(np.ones((query_len, key_len), bool)) if use_causal_mask else True)
    expected = np.where(allowed.any(-1)[..., None], expected, 0.0)
    _compare(surface, output, expected, "float32", f"{mode} {config} causal={use_causal_mask}")


def test_multi_head_attention_matches_keras_with_the_same_weights():
    _layer_against_keras()


@fuzzed(ci_examples=30)
@given(data=st.data())
def _masks_against_numpy(data):
    query_len = data.draw(st.integers(0, 9), label="query_len")
    key_len = data.draw(st.integers(0, 9), label="key_len")
    window = data.draw(st.integers(1, 10), label="window")
    offset = data.draw(st.integers(0, 5), label="query_offset")
    rows = np.arange(query_len)[:, None] + offset
    columns = np.arange(key_len)[None, :]
    for surface, call, expected in (
        ("causal_mask", lambda: keras_attn.causal_mask(query_len, key_len, query_offset=offset), columns <= rows),
        (
            "sliding_window_mask",
            lambda: keras_attn.sliding_window_mask(query_len, key_len, window),
            np.abs(rows - offset - columns) < window,  # the band |i - j| < window, no offset given
        ),
    ):
        actual = np.asarray(call())[0, 0]  # (1, 1, query_len, key_len)
        if actual.shape == expected.shape and np.array_equal(actual, expected):
            record(surface, "right")
        else:
            record(surface, "silent wrong")
            raise AssertionError(f"{surface}({query_len}, {key_len}, window={window}, offset={offset}): {actual}")


def test_the_masks_match_numpy():
    _masks_against_numpy()


@fuzzed(ci_examples=25)
@given(data=st.data())
def _pooling_against_numpy(data):
    surface = "MaskedGlobalPooling.call"
    mode = data.draw(st.sampled_from(["mean", "max"]), label="mode")
    batch, length = data.draw(st.integers(1, 2), label="batch"), data.draw(st.sampled_from([1, 2, 5]), label="length")
    dtype = data.draw(st.sampled_from(_DTYPES), label="dtype")
    inputs = _tensor(data, (batch, length, 3), dtype, "inputs")
    bits = data.draw(st.lists(st.booleans(), min_size=batch * length, max_size=batch * length), label="mask")
    mask = np.array(bits, bool).reshape(batch, length)
    layer = keras_attn.MaskedGlobalPooling(mode)
    try:
        output = layer(inputs, mask=mask)
    except Exception as error:
        _refused_clearly(surface, error, ["inputs", "mask"])
        return
    # A Keras layer computes in its compute dtype whatever the inputs' (float64 in, float32 math
    # and out, as keras.layers.GlobalAveragePooling1D): the oracle pools the values it was given.
    values = inputs.astype(layer.compute_dtype).astype("float64")
    if mode == "mean":
        counts = mask.sum(-1, keepdims=True)
        expected = np.divide((values * mask[..., None]).sum(1), counts, out=np.zeros((batch, 3)), where=counts > 0)
    else:
        expected = np.where(mask.any(-1, keepdims=True), np.where(mask[..., None], values, -np.inf).max(1), 0.0)
    _compare(surface, output, expected, layer.compute_dtype, f"{mode} mask={mask.tolist()}")


def test_masked_global_pooling_matches_numpy():
    _pooling_against_numpy()


def _tensor_surfaces():
    """`(surface, call of its keyword arguments, valid tensor arguments)`, one per surface and arguments."""
    return [(surface, call, valid) for surface, call, valid, _ in _surfaces()]


# Each tensor argument of the public calls (tests/test_contracts.py's valid calls, their layers built
# once) in another dtype: the same values in a dtype of its spec's kind give the same outputs, a
# dtype outside it the same outputs or a clear refusal naming the argument.
TENSOR_SURFACES = _tensor_surfaces()
_VARIANTS = ("float16", "float64", "int8", "int64", "uint8", "bool", "str")
_KIND_OF = {"float16": "float", "float64": "float", "int8": "int", "int64": "int", "uint8": "int", "bool": "bool"}


def _same_values(value, dtype):
    """`value` made exactly representable in `dtype`: whole non-negative numbers for an integer dtype, 0/1
    for bool, at most 2**10 for float16 (whose integers are exact up to 2**11)."""
    value = np.asarray(value)
    if dtype in ("int8", "int64", "uint8", "str"):
        return np.clip(np.abs(np.round(value)), 0, 100).astype(value.dtype)
    if dtype == "bool":
        return (value != 0).astype(value.dtype)
    if dtype == "float16":
        return np.clip(np.round(value * 8) / 8, -1024, 1024).astype(value.dtype)
    return value


@fuzzed(ci_examples=20)
@given(data=st.data())
def _tensor_dtypes(data):
    surface, call, valid = data.draw(st.sampled_from(TENSOR_SURFACES), label="surface")
    argument = data.draw(st.sampled_from(sorted(valid)), label="argument")
    dtype = data.draw(st.sampled_from(_VARIANTS), label="dtype")
    base = {**valid, argument: _same_values(valid[argument], dtype)}
    try:
        expected = [np.asarray(leaf, "float64") for leaf in tf.nest.flatten(call(dict(base)))]
    except (ValueError, TypeError):
        return  # the rounded values are no valid call (e.g. ids that no longer run contiguously)
    variant = base[argument].astype(dtype if dtype != "str" else str)
    kinds = contracts.spec(f"keras_attn.{surface}", argument).dtype.split("|")
    allowed = ("any" in kinds and dtype != "str") or _KIND_OF.get(dtype) in kinds  # "any": numeric or bool
    try:
        outputs = [np.asarray(leaf, "float64") for leaf in tf.nest.flatten(call({**base, argument: variant}))]
    except Exception as error:
        if not allowed and isinstance(error, (ValueError, TypeError)) and argument in str(error):
            record(surface, "clear error")
            return
        record(surface, "unclear")
        raise AssertionError(
            f"{surface} {argument} as {dtype} ({kinds} allowed): {type(error).__name__}: {error}"
        ) from error
    tolerance = 2e-2 if dtype == "float16" else 1e-5
    scale = max([1.0] + [float(np.max(np.abs(leaf), initial=0.0)) for leaf in expected])
    if all(a.shape == b.shape and np.allclose(a, b, atol=tolerance * scale, rtol=0) for a, b in zip(outputs, expected)):
        record(surface, "right")
        return
    record(surface, "silent wrong")
    raise AssertionError(f"{surface}: {argument} as {dtype} changes the output")


def test_a_tensor_argument_in_another_dtype_gives_the_same_output_or_a_clear_error():
    _tensor_dtypes()
