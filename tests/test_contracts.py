"""The contract of every public argument (`keras_attn.contracts`): every argument has a spec, and the
bad values of each tensor argument's kind, drawn from a valid call, are refused with a `ValueError`
or `TypeError` naming the argument, also by a layer already built on valid inputs.

The scalar arguments of the constructors are walked by tests/test_argument_validation.py from the
same specs. Each surface's valid call is tiny (batch 2, a few tokens) and its layer is built once.
"""

import importlib
import inspect

import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from keras_attn import contracts
from keras_attn import packing
from keras_attn import patterns
from tests.keras_versions import skip_unless_input_spec_error_names_it
from tests.test_argument_validation import BAD_VALUES

BATCH, LENGTH, FEATURES = 2, 6, 4
IDS = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2]], "int32")  # valid everywhere (DOCUMENTS)
SEQUENCE = np.random.default_rng(0).normal(size=(BATCH, LENGTH, FEATURES)).astype("float32")
HEADS = np.random.default_rng(1).normal(size=(BATCH, LENGTH, 2, FEATURES)).astype("float32")
REAL = np.ones((BATCH, LENGTH), bool)


def test_every_public_argument_has_a_spec():
    """A new public function, layer or argument fails here until `keras_attn.contracts` declares it."""
    arguments = contracts.public_arguments()
    missing = [(surface, name) for surface, name in arguments if contracts.spec(surface, name) is None]
    assert not missing
    kinds = set(contracts.SCALAR_KINDS) | set(contracts.TENSOR_KINDS) | {contracts.OBJECT}
    assert {contracts.spec(surface, name).kind for surface, name in arguments} <= kinds


def _public_surfaces():
    """`(surface, function or class)` of every public name of the enforced modules."""
    for module_name in contracts.ENFORCED_MODULES:
        module = importlib.import_module(module_name)
        for name in contracts._public_names(module):
            thing = getattr(module, name)
            if callable(thing) and not inspect.ismodule(thing):
                yield f"{module_name}.{name}", thing


def test_every_public_surface_checks_its_specs_at_its_entry():
    """Every public function, and the `__init__` and `call` of every public class and of its keras_attn
    bases, runs `contracts.check_arguments` first (`contracts.checked`): a surface cannot ship unchecked."""
    unchecked = []
    for surface, thing in _public_surfaces():
        bases = (
            [base for base in thing.__mro__ if base.__module__.startswith("keras_attn")]
            if inspect.isclass(thing)
            else []
        )
        methods = [vars(base)[method] for base in bases for method in ("__init__", "call") if method in vars(base)]
        functions = methods if inspect.isclass(thing) else [thing]
        unchecked += [(surface, f.__qualname__) for f in functions if not hasattr(f, "__contract__")]
    assert not unchecked


def test_a_checked_surface_refuses_a_bad_argument_before_running():
    with pytest.raises(ValueError, match=r"Received: key_len=-1"):
        keras_attn.causal_mask(2, -1)
    with pytest.raises(ValueError, match=r"Received: feature_map='nonsense'"):
        keras_attn.LinearAttention(num_heads=2, key_dim=2, feature_map="nonsense")
    with pytest.raises(ValueError, match=r"Received: use_causal_mask='yes'"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=2)(SEQUENCE, SEQUENCE, use_causal_mask="yes")


# A value of each kind its check takes, and one it refuses.
_GOOD_AND_BAD = {
    "bool": (True, "no"),
    "truth_value": (0, 2),
    "bool_or_none": (None, "no"),
    "positive_int": (3, 0),
    "positive_int_or_none": (None, -1),
    "rate": (0.5, 1.0),
    "rate_or_none": (None, float("nan")),
    "positive_number": (2.0, -1.0),
    "positive_number_or_none": (None, 0.0),
    "non_negative_number_or_none": (0.0, -0.5),
    "number_above_1": (2.0, 1.0),
    "choice": (None, "nonsense"),
    "axes": ((1,), ()),
    "position": (0, 1.5),
}


def _every_spec():
    yield from SPECS_BY_NAME.items()
    for surface, specs in contracts.SURFACE_SPECS.items():
        yield from ((f"{surface}:{name}", spec) for name, spec in specs.items())


SPECS_BY_NAME = contracts.SPECS


@pytest.mark.parametrize("label, spec", list(_every_spec()), ids=[label for label, _ in _every_spec()])
def test_every_spec_names_a_check_that_takes_good_and_refuses_bad_values(label, spec):
    """A spec without a check cannot exist: each names one of `contracts.CHECKS`, run here on a good and a bad value."""
    if spec.kind == contracts.OBJECT:
        assert spec.check is None  # resolved by Keras or a registry, which refuses what it cannot resolve
        return
    check = contracts.CHECKS[spec.check]
    name = label.rpartition(":")[2]
    if spec.kind in contracts.TENSOR_KINDS:
        rank = int((spec.rank or "0").removeprefix(">=").partition("-")[0])
        good = np.zeros((1,) * rank, {"any": "float32"}.get(spec.dtype.split("|")[0], spec.dtype.split("|")[0]))
        bad = np.array(["text"] * 2)
    else:
        good, bad = _GOOD_AND_BAD[spec.kind]
        good = spec.choices()[0] if spec.kind == "choice" else good
    check(spec, name, good)
    with pytest.raises(ValueError, match=name):
        check(spec, name, bad)


def _bad_tensors(spec, valid, related, runs=False):
    """The bad values of a tensor argument of `spec`, drawn from its `valid` value: `{label: value}`.
    `related`: the call has other tensors whose batch and length this one must match."""
    kind = spec.kind
    valid = np.asarray(valid)
    bad = {}
    if not spec.rank.startswith(">="):
        bad.update({"rank - 1": valid[0], "rank + 1": valid[..., None]})
    if related:
        bad["batch + 1"] = np.concatenate([valid, valid[:1]], axis=0)
        if kind in ("segment_ids", "positions", "token_ids", "padding_mask", "document_mask"):
            bad["length + 1"] = np.concatenate([valid, valid[:, :1]], axis=1)
            bad["empty"] = valid[:, :0]
    if kind in ("segment_ids", "positions", "token_ids", "lengths"):
        negative = valid.copy()
        negative.flat[0] = -1
        huge = valid.astype("int64")
        huge.flat[0] = 2**40
        bad.update({"negative": negative, "huge": huge})
        # Whole-number float token ids are ids (`keras_attn.utils.checked_ids`); fractional ones are not.
        bad["float"] = valid.astype("float32") + (0.5 if kind == "token_ids" else 0.0)
    if kind == "segment_ids" and runs:
        reappearing = valid.copy()
        reappearing[0] = [1, 1, 2, 2, 1, 1]
        decreasing_then_back = valid.copy()
        decreasing_then_back[1] = [2, 1, 1, 2, 0, 0]
        bad.update({"id reappears": reappearing, "id decreases and reappears": decreasing_then_back})
    if kind == "token_ids":
        bad["past vocabulary"] = valid + 100
    if kind == "document_mask":
        bad["float"] = valid.astype("float32")
    if kind in ("losses", "lengths") and "float" not in bad:
        bad["int"] = valid.astype("int32")
    if kind == "sequence" and spec.relation == "width the layer was built on":
        bad["width - 1 after build"] = valid[..., :-1]
    return bad


# Each surface: (name, a function calling it with the valid arguments updated by its argument, the valid
# tensor arguments, the arguments read as document runs). Layers are built once, on the valid call.
def _surfaces():
    pooling = keras_attn.MaskedGlobalPooling("mean", max_documents=2)
    attention_pooling = keras_attn.AttentionPooling(num_heads=2, key_dim=2, max_documents=2)
    position_embedding = keras_attn.PositionEmbedding(sequence_length=8)
    sinusoidal = keras_attn.SinusoidalPositionEncoding()
    rotary = keras_attn.RotaryEmbedding()
    token_and_position = keras_attn.TokenAndPositionEmbedding(vocabulary_size=10, sequence_length=8, embedding_dim=4)
    multi_head = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2)
    linear = keras_attn.LinearAttention(num_heads=2, key_dim=2, chunk_size=2, causal=True)
    lsh = keras_attn.LSHSelfAttention(num_heads=2, key_dim=2, num_buckets=2, chunk_size=2)
    encoder = keras_attn.TransformerEncoder(intermediate_dim=4, num_heads=2)
    feed_forward = keras_attn.FeedForward(intermediate_dim=4)
    token_ids = IDS + 3
    losses = SEQUENCE[..., 0]
    document_mask = np.array([[True, True], [True, True]])

    def layer_call(layer, first):
        return lambda args: layer(args.pop(first), **args)

    return [
        ("MaskedGlobalPooling.call", layer_call(pooling, "inputs"), {"inputs": SEQUENCE, "segment_ids": IDS}, ()),
        ("MaskedGlobalPooling.call", layer_call(pooling, "inputs"), {"inputs": SEQUENCE, "mask": REAL}, ()),
        (
            "AttentionPooling.call",
            layer_call(attention_pooling, "inputs"),
            {"inputs": SEQUENCE, "segment_ids": IDS},
            (),
        ),
        ("AttentionPooling.call", layer_call(attention_pooling, "inputs"), {"inputs": SEQUENCE, "mask": REAL}, ()),
        (
            "PositionEmbedding.call",
            layer_call(position_embedding, "inputs"),
            {"inputs": SEQUENCE, "segment_ids": IDS},
            ("segment_ids",),
        ),
        (
            "PositionEmbedding.call",
            layer_call(position_embedding, "inputs"),
            {"inputs": SEQUENCE, "positions": document_positions_of(IDS)},
            (),
        ),
        (
            "SinusoidalPositionEncoding.call",
            layer_call(sinusoidal, "inputs"),
            {"inputs": SEQUENCE, "segment_ids": IDS},
            ("segment_ids",),
        ),
        (
            "SinusoidalPositionEncoding.call",
            layer_call(sinusoidal, "inputs"),
            {"inputs": SEQUENCE, "positions": document_positions_of(IDS)},
            (),
        ),
        ("RotaryEmbedding.call", layer_call(rotary, "inputs"), {"inputs": HEADS, "segment_ids": IDS}, ("segment_ids",)),
        (
            "TokenAndPositionEmbedding.call",
            layer_call(token_and_position, "token_ids"),
            {"token_ids": token_ids, "segment_ids": IDS},
            ("segment_ids",),
        ),
        (
            "MultiHeadAttention.call",
            layer_call(multi_head, "query"),
            {"query": SEQUENCE, "value": SEQUENCE, "segment_ids": IDS},
            (),
        ),
        (
            "MultiHeadAttention.call",
            layer_call(multi_head, "query"),
            {"query": SEQUENCE, "query_mask": REAL, "value_mask": REAL, "key_mask": REAL},
            (),
        ),
        (
            "MultiHeadAttention.call",
            layer_call(multi_head, "query"),
            {"query": SEQUENCE, "value": SEQUENCE, "query_segment_ids": IDS, "key_segment_ids": IDS},
            (),
        ),
        (
            "LinearAttention.call",
            layer_call(linear, "query"),
            {"query": SEQUENCE, "segment_ids": IDS},
            ("segment_ids",),
        ),
        ("LSHSelfAttention.call", layer_call(lsh, "query"), {"query": SEQUENCE, "segment_ids": IDS}, ("segment_ids",)),
        (
            "TransformerEncoder.call",
            layer_call(encoder, "inputs"),
            {"inputs": SEQUENCE, "segment_ids": IDS, "padding_mask": REAL},
            (),
        ),
        ("FeedForward.call", layer_call(feed_forward, "inputs"), {"inputs": SEQUENCE}, ()),
        (
            "SelfAttention.call",
            layer_call(keras_attn.SelfAttention(num_heads=2, key_dim=2), "query"),
            {"query": SEQUENCE, "segment_ids": IDS},
            (),
        ),
        (
            "CausalSelfAttention.call",
            layer_call(keras_attn.CausalSelfAttention(num_heads=2, key_dim=2), "query"),
            {"query": SEQUENCE, "segment_ids": IDS},
            (),
        ),
        (
            "CrossAttention.call",
            layer_call(keras_attn.CrossAttention(num_heads=2, key_dim=2), "query"),
            {"query": SEQUENCE, "value": SEQUENCE, "query_segment_ids": IDS, "key_segment_ids": IDS},
            (),
        ),
        (
            "TransformerDecoder.call",
            layer_call(keras_attn.TransformerDecoder(intermediate_dim=4, num_heads=2), "decoder_sequence"),
            {"decoder_sequence": SEQUENCE, "decoder_segment_ids": IDS, "decoder_padding_mask": REAL},
            (),
        ),
        (
            "ops.dot_product_attention",
            lambda args: keras_attn.ops.dot_product_attention(**args),
            {"query": HEADS, "key": HEADS, "value": HEADS},
            (),
        ),
        (
            "scaled_dot_product_attention",
            lambda args: keras_attn.scaled_dot_product_attention(**args),
            {"query": HEADS, "key": HEADS, "value": HEADS, "segment_ids": IDS},
            (),
        ),
        (
            "scaled_dot_product_attention",
            lambda args: keras_attn.scaled_dot_product_attention(**args),
            {"query": HEADS, "key": HEADS, "value": HEADS, "query_segment_ids": IDS, "key_segment_ids": IDS},
            (),
        ),
        (
            "document_positions",
            lambda args: keras_attn.document_positions(**args),
            {"segment_ids": IDS},
            ("segment_ids",),
        ),
        (
            "packing.unpack",
            lambda args: packing.unpack(**args),
            {"values": SEQUENCE, "document_mask": document_mask, "segment_ids": IDS},
            (),
        ),
        ("packing.unpack", lambda args: packing.unpack(**args), {"values": SEQUENCE, "document_mask": REAL}, ()),
        (
            "packing.place",
            lambda args: packing.place(row_length=5, **args),
            {"lengths": np.array([3, 2, 4], "int32")},
            (),
        ),
        (
            "packing.mean_over_tokens",
            lambda args: packing.mean_over_tokens(**args),
            {"losses": losses, "segment_ids": IDS},
            (),
        ),
        (
            "packing.mean_over_documents",
            lambda args: packing.mean_over_documents(**args),
            {"losses": losses[:, :2], "document_mask": document_mask},
            (),
        ),
    ]


def document_positions_of(ids):
    return np.asarray(keras_attn.document_positions(ids))


def _surface_name(surface):
    return f"keras_attn.{surface}"


def _cases():
    """Each (surface, argument) walked once, from the first valid call that passes it."""
    cases, walked = [], set()
    for surface, call, valid, runs in _surfaces():
        name = _surface_name(surface)
        for argument, value in valid.items():
            if (surface, argument) in walked:
                continue
            walked.add((surface, argument))
            spec = contracts.spec(name, argument)
            for label, bad in _bad_tensors(spec, value, len(valid) > 1, runs=argument in runs).items():
                if (surface, argument, label) not in VALID_HERE:
                    cases.append((surface, call, valid, argument, label, bad))
    return cases


# Values of a bad class that are valid on this surface: per-token `unpack` reads `document_mask`'s second
# axis as the documents a row can hold (any number).
VALID_HERE = {("packing.unpack", "document_mask", "length + 1"), ("packing.unpack", "document_mask", "empty")}


CASES = _cases()


@pytest.mark.parametrize(
    "surface, call, valid, argument, label, bad",
    CASES,
    ids=[f"{case[0]}-{case[3]}-{case[4]}-{index}" for index, case in enumerate(CASES)],
)
def test_a_bad_tensor_argument_is_refused_naming_it(surface, call, valid, argument, label, bad):
    call(dict(valid))  # builds the layer on the valid arguments (a no-op after the first case)
    with pytest.raises((ValueError, TypeError)) as error:
        call({**valid, argument: bad})
    if argument not in str(error.value):
        skip_unless_input_spec_error_names_it(error.value)
    assert argument in str(error.value), (label, str(error.value))


# The scalar arguments of the public functions and of the patterns (the layers' constructors are walked by
# tests/test_argument_validation.py): (surface, a function of the keyword arguments, valid ones).
def _documents():
    return tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[5, 6], [7]]))


SCALAR_SURFACES = [
    ("causal_mask", keras_attn.causal_mask, {"query_len": 3, "key_len": 4, "query_offset": 1}),
    ("sliding_window_mask", keras_attn.sliding_window_mask, {"query_len": 3, "key_len": 4, "window": 2}),
    (
        "scaled_dot_product_attention",
        keras_attn.scaled_dot_product_attention,
        {
            "query": HEADS,
            "key": HEADS,
            "value": HEADS,
            "is_causal": False,
            "sliding_window": None,
            "query_offset": 0,
            "scale": None,
            "dropout_rate": 0.0,
            "training": False,
            "return_weights": False,
            "implementation": "auto",
            "hard": False,
            "logit_soft_cap": None,
            "zero_unattended_keys": True,
        },
    ),
    ("set_measured_dispatch", keras_attn.set_measured_dispatch, {"enabled": None, "tie_tolerance": None}),
    (
        "explain_implementation",
        keras_attn.explain_implementation,
        {"query_shape": (1, 8, 2, 4), "dtype": "float32", "packed": False},
    ),
    (
        "ops.dot_product_attention",
        keras_attn.ops.dot_product_attention,
        {"query": HEADS, "key": HEADS, "value": HEADS, "is_causal": False, "flash_attention": None},
    ),
    ("packing.place", packing.place, {"lengths": [3, 2], "row_length": 5, "strategy": "first_fit"}),
    (
        "packing.pack",
        lambda **args: packing.pack(_documents(), **args),
        {"row_length": 4, "max_documents": 2, "strategy": "first_fit", "window": 2, "truncate": False},
    ),
    ("patterns.SlidingWindow", patterns.SlidingWindow, {"window": 2}),
    ("patterns.Strided", patterns.Strided, {"stride": 2}),
    ("patterns.BlockLocal", patterns.BlockLocal, {"block_size": 2}),
    ("patterns.GlobalTokens", patterns.GlobalTokens, {"num_tokens": 1}),
]
# A position or a length: an int in [0, 2**31 - 1] (`keras_attn.validation.check_position`).
POSITION_BAD = (-1, 1.5, float("nan"), "3", True, None, 2**40)


def _scalar_cases():
    cases = []
    for surface, call, valid in SCALAR_SURFACES:
        for argument in valid:
            kind = contracts.spec(_surface_name(surface), argument).kind
            bad_values = POSITION_BAD if kind == "position" else BAD_VALUES.get(kind, ())
            cases += [(surface, call, valid, argument, bad) for bad in bad_values]
    return cases


SCALAR_CASES = _scalar_cases()


@pytest.mark.parametrize(
    "surface, call, valid, argument, bad",
    SCALAR_CASES,
    ids=[f"{case[0]}-{case[3]}-{case[4]!r}" for case in SCALAR_CASES],
)
def test_a_bad_scalar_argument_is_refused_naming_it(surface, call, valid, argument, bad):
    with pytest.raises((ValueError, TypeError)) as error:
        call(**{**valid, argument: bad})
    assert argument in str(error.value), str(error.value)


def test_the_contract_counts(capsys):
    """Per surface: its arguments with a spec, and the bad-input cases tried here (printed for the report)."""
    arguments = contracts.public_arguments()
    per_surface = {}
    for surface, _ in arguments:
        key = surface.removesuffix(".__init__").removesuffix(".call").removeprefix("keras_attn.")
        per_surface.setdefault(key, [0, 0])[0] += 1
    for surface, *_ in CASES + SCALAR_CASES:
        per_surface[surface.removesuffix(".call")][1] += 1
    with capsys.disabled():
        print(f"\n{len(arguments)} arguments with a spec, {len(CASES) + len(SCALAR_CASES)} generated call cases")
        for surface, (specs, cases) in sorted(per_surface.items()):
            print(f"  {surface}: {specs} arguments, {cases} call cases")
    assert all(per_surface[surface.removesuffix(".call")][1] for surface, *_ in CASES)


def test_a_surface_called_in_a_traced_function_runs_as_written_without_autograph(monkeypatch):
    """AutoGraph converts what a traced function calls; a public surface runs as written (its loops
    are `tf.while_loop`s), so no TensorFlow version's AutoGraph can mis-convert the kernels."""
    from tensorflow.python.autograph.core import ag_ctx

    from keras_attn.kernels import KERNELS

    statuses, dense = [], KERNELS["dense"]
    attend_densely = dense.attend
    monkeypatch.setattr(
        dense, "attend", lambda call: statuses.append(ag_ctx.control_status_ctx().status) or attend_densely(call)
    )

    @tf.function
    def attend(x):
        return keras_attn.scaled_dot_product_attention(x, x, x, implementation="dense")

    np.testing.assert_allclose(attend(tf.ones((1, 2, 1, 2))), np.ones((1, 2, 1, 2)), atol=1e-6)
    assert statuses == [ag_ctx.Status.DISABLED]
