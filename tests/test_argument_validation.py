"""Every public layer's constructor arguments, walked with NaN, infinities, 0, negatives, wrong
types and strings: each bad value gets a `ValueError`/`TypeError` naming the argument and quoting
the value (`keras_attn.validation`), never a layer that silently does something else.

Each parameter's kind is its spec's (`keras_attn.contracts`, one declaration per argument); a new
class or parameter without a spec fails `test_every_public_parameter_is_classified`, so nothing goes
unwalked. The tensor arguments of the calls are walked by tests/test_contracts.py.
"""

import inspect
import math

import pytest

import keras_attn
from keras_attn import contracts

# What each class needs to be built at all (valid values).
MHA_REQUIRED = {"num_heads": 2, "key_dim": 4}
REQUIRED = {
    "ALiBi": {"num_heads": 2},
    "AttentionPooling": MHA_REQUIRED,
    "CausalSelfAttention": MHA_REQUIRED,
    "CrossAttention": MHA_REQUIRED,
    "FeedForward": {"intermediate_dim": 4},
    "LSHSelfAttention": MHA_REQUIRED,
    "LinearAttention": MHA_REQUIRED,
    "LinformerSelfAttention": {**MHA_REQUIRED, "max_length": 8, "projected_length": 4},
    "MaskedGlobalPooling": {},
    "MultiHeadAttention": MHA_REQUIRED,
    "PositionEmbedding": {"sequence_length": 8},
    "RelativePositionBias": {"num_heads": 2},
    "RotaryEmbedding": {},
    "SelfAttention": MHA_REQUIRED,
    "SinusoidalPositionEncoding": {},
    "TokenAndPositionEmbedding": {"vocabulary_size": 10, "sequence_length": 8, "embedding_dim": 4},
    "TransformerDecoder": {"intermediate_dim": 8, "num_heads": 2},
    "TransformerEncoder": {"intermediate_dim": 8, "num_heads": 2},
}

NAN, INF = float("nan"), float("inf")
# A size no int32 index reaches (every integer argument sizes a weight, a table or positions):
# refused before anything is allocated (`ALiBi(num_heads=2**40)` ran until it was killed).
HUGE = 2**40
# Finite, but past float32's largest value: a scale of the float32 logits that would be `inf`.
PAST_FLOAT32 = 3.5e38
# The bad values of each kind of argument. Where 0 or None is a documented right answer it is not
# listed (a rate of 0 is no dropout; None is the documented default of the `_or_none` kinds).
BAD_VALUES = {
    "bool": ("no", "yes", 1, 0, None),
    "bool_or_none": ("no", 1),
    "truth_value": ("no", 2, -1, 0.0, None),
    "positive_int": (0, -1, 1.5, NAN, INF, "3", True, HUGE),
    "positive_int_or_none": (0, -1, 1.5, NAN, INF, "3", True, HUGE),
    "rate": (-0.1, 1.0, NAN, INF, "0.1", True),
    "rate_or_none": (-0.1, 1.0, NAN, INF, "0.1"),
    "positive_number": (0, -1.0, NAN, INF, -INF, "1", True),
    "positive_number_or_none": (0, -1.0, NAN, INF, -INF, "1", True, PAST_FLOAT32),
    "non_negative_number_or_none": (-1.0, NAN, INF, -INF, "1", True),
    "number_above_1": (1, 0.5, NAN, INF, -INF, "2", True),
    "choice": ("nonsense", True),
    "axes": ((),),
}


def _kind(class_name, name):
    """The kind of a constructor argument, from its one declaration (`keras_attn.contracts`)."""
    argument = contracts.spec(f"keras_attn.{class_name}.__init__", name)
    return None if argument is None else argument.kind


def _public_classes():
    return sorted(name for name in keras_attn.__all__ if inspect.isclass(getattr(keras_attn, name)))


def _parameters(class_name):
    """The constructor's named parameters, the base class's included where it takes `**kwargs` to them."""
    names = []
    for klass in getattr(keras_attn, class_name).__mro__:
        if klass.__module__.startswith("keras_attn") and "__init__" in vars(klass):
            for parameter in list(inspect.signature(klass.__init__).parameters.values())[1:]:
                if (
                    parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
                    and parameter.name not in names
                ):
                    names.append(parameter.name)
    return names


def test_every_public_parameter_is_classified():
    assert set(_public_classes()) == set(REQUIRED), "a public class without its REQUIRED entry"
    unclassified = {(cls, name) for cls in _public_classes() for name in _parameters(cls) if _kind(cls, name) is None}
    assert not unclassified


CASES = [
    (cls, name, bad)
    for cls in _public_classes()
    for name in _parameters(cls)
    if _kind(cls, name) not in (None, contracts.OBJECT)
    for bad in BAD_VALUES[_kind(cls, name)]
]


@pytest.mark.parametrize("class_name, name, bad", CASES, ids=[f"{c}-{n}-{b!r}" for c, n, b in CASES])
def test_a_bad_argument_is_refused_naming_it_and_its_value(class_name, name, bad):
    kwargs = {**REQUIRED[class_name], name: bad}
    with pytest.raises((ValueError, TypeError)) as error:
        getattr(keras_attn, class_name)(**kwargs)
    message = str(error.value)
    assert name in message, message
    shown = "nan" if isinstance(bad, float) and math.isnan(bad) else repr(bad)
    assert shown in message or str(bad) in message, message


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0, float("inf")])
def test_an_eager_tensor_scale_is_checked_by_value(bad):
    import numpy as np
    import tensorflow as tf

    x = np.ones((1, 2, 1, 4), "float32")
    with pytest.raises(ValueError, match="scale"):
        keras_attn.MultiHeadAttention(num_heads=1, key_dim=4, scale=tf.constant(bad))
    with pytest.raises(ValueError, match="scale"):
        keras_attn.scaled_dot_product_attention(x, x, x, scale=tf.constant(bad))
    # A valid tensor scale is taken, and a symbolic one inside tf.function passes to run time.
    keras_attn.scaled_dot_product_attention(x, x, x, scale=tf.constant(0.5))
    tf.function(lambda s: keras_attn.scaled_dot_product_attention(x, x, x, scale=s))(tf.constant(0.5))


# (class, constructor arguments, the input shape to build it on or None, the arguments the error names):
# each size is accepted alone, the weight or table they make together holds over 2**31 - 1 elements.
TOO_MANY_ELEMENTS = [
    ("MultiHeadAttention", {"num_heads": 2**16, "key_dim": 2**16}, None, ("num_heads", "key_dim")),
    ("MultiHeadAttention", {"num_heads": 2**10, "key_dim": 2**10}, (None, None, 2**12), ("features", "num_heads")),
    ("SelfAttention", {"num_heads": 2**16, "key_dim": 2**16}, None, ("num_heads", "key_dim")),
    ("LinearAttention", {"num_heads": 2**10, "key_dim": 2**10}, (None, None, 2**12), ("features", "key_dim")),
    (
        "LinearAttention",
        {"num_heads": 2, "key_dim": 2**16, "feature_map": "favor", "num_random_features": 2**16},
        None,
        ("num_random_features", "key_dim"),
    ),
    (
        "LinformerSelfAttention",
        {"num_heads": 2, "key_dim": 4, "max_length": 2**16, "projected_length": 2**16},
        None,
        ("max_length", "projected_length"),
    ),
    (
        "LSHSelfAttention",
        {"num_heads": 2**8, "key_dim": 2**8, "num_hashes": 2**8, "num_buckets": 2**8},
        None,
        ("num_hashes", "num_buckets"),
    ),
    ("RelativePositionBias", {"num_heads": 2**16, "num_buckets": 2**16, "max_distance": 2**20}, None, ("num_buckets",)),
    (
        "TokenAndPositionEmbedding",
        {"vocabulary_size": 2**20, "sequence_length": 8, "embedding_dim": 2**12},
        None,
        ("vocabulary_size", "embedding_dim"),
    ),
    ("PositionEmbedding", {"sequence_length": 2**20}, (None, None, 2**12), ("sequence_length", "features")),
    ("FeedForward", {"intermediate_dim": 2**20}, (None, None, 2**12), ("features", "intermediate_dim")),
    ("TransformerEncoder", {"intermediate_dim": 2**20, "num_heads": 2}, (None, None, 2**12), ("intermediate_dim",)),
]


@pytest.mark.parametrize(
    "class_name, kwargs, input_shape, names",
    TOO_MANY_ELEMENTS,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(TOO_MANY_ELEMENTS)],
)
def test_a_weight_past_the_element_limit_is_refused_before_it_is_allocated(class_name, kwargs, input_shape, names):
    """The sizes are valid one by one; the weight they make together (16 GiB and more in float32)
    is refused by the constructor, or by `build` once the input's feature size is known, naming
    the arguments and their values: it used to exhaust the memory while being allocated."""
    with pytest.raises(ValueError) as error:
        layer = getattr(keras_attn, class_name)(**kwargs)
        layer.build(input_shape)
    message = str(error.value)
    assert "2147483647" in message, message
    for name in names:
        value = input_shape[-1] if name == "features" else kwargs[name]
        assert f"{name}={value}" in message, message
