"""Packed rows through every attention family of the registry (issue #39, items 1 and 4).

Parametrised over `keras_attn.attention_families.FAMILIES` by what each family's `capabilities`
declare. A family declaring `segments` must give each document of a packed row what the same layer
(same weights) gives it alone: outputs against the family's float64 NumPy reference of the document
alone, outputs and gradients (input and weights) against the layer run on each document, under
float32, mixed_float16 and XLA, causal too where the family is; padding outputs exactly zero and
gets no gradient; converted to ONNX, the same outputs. A family not declaring it refuses `segment_ids`, quoting its declared reason.

The documents' lengths (6, 3, 9 and 9, 9 in the second row) are whole numbers of LSH's `chunk_size`
(3 in `ARGUMENTS`): where LSH's hashed chunks are the ones the document has alone, so its packed
output can equal the alone one (`tests/test_lsh_attention.py` covers other lengths); linear
attention's chunks of 4 straddle the documents.
"""

import keras
import numpy as np
import onnxruntime
import pytest
import tensorflow as tf
import tf2onnx

from export.onnx_conversion import OPSET
from keras_attn import attention_families
from keras_attn.attention_families import FAMILIES
from tests.layer_checks import MIXED_PRECISION_TOLERANCES
from tests.test_attention_families import ARGUMENTS
from tests.test_attention_families import _float64_reference

HIDDEN = 6
LAYOUTS = ((6, 3, 9), (9, 9))  # per row, the documents' lengths; the rest of the row is padding
LENGTH = 21
ATOL = {"float32": 2e-5, **MIXED_PRECISION_TOLERANCES}


def _modes(family):
    return [False, True] if family.capabilities.causal else [False]


PACKED = [name for name, family in FAMILIES.items() if family.capabilities.segments]
REFUSING = [name for name, family in FAMILIES.items() if not family.capabilities.segments]
CASES = [(name, causal) for name in PACKED for causal in _modes(FAMILIES[name])]


def _family(name, policy="float32"):
    return attention_families.build(
        name, num_heads=2, key_dim=4, bias_initializer="random_normal", dtype=policy, **ARGUMENTS[name]
    )


def _packed_row(seed=0):
    """`(x, segment_ids, documents)`: `(2, LENGTH, HIDDEN)` inputs with padding NaN, ids, and `(row, start, stop)`."""
    x = np.random.default_rng(seed).standard_normal((2, LENGTH, HIDDEN)).astype("float32")
    segment_ids = np.zeros((2, LENGTH), "int32")
    documents = []
    for row, lengths in enumerate(LAYOUTS):
        start = 0
        for number, length in enumerate(lengths, 1):
            segment_ids[row, start : start + length] = number
            documents.append((row, start, start + length))
            start += length
    x[segment_ids == 0] = np.nan  # padding content reaches nothing
    return x, segment_ids, documents


def _call(layer, x, causal, segment_ids=None):
    return layer(x, use_causal_mask=causal, segment_ids=segment_ids)


def _output_and_gradients(layer, x, causal, cotangent, segment_ids=None, jit_compile=None):
    """The output and the gradients of `sum(output * cotangent)` for the input and each trainable weight."""

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            output = _call(layer, x, causal, segment_ids)
            loss = tf.reduce_sum(tf.cast(output, "float32") * cotangent)
        return output, tape.gradient(loss, [x] + layer.trainable_weights)

    if jit_compile is not None:
        run = tf.function(run, jit_compile=jit_compile)
    output, (input_gradient, *weight_gradients) = run(tf.constant(x))
    return np.asarray(output, np.float64), np.asarray(input_gradient), [np.asarray(g) for g in weight_gradients]


@pytest.mark.parametrize("name,causal", CASES)
def test_each_document_of_a_packed_row_gets_its_float64_output_alone(name, causal):
    x, segment_ids, documents = _packed_row()
    layer = _family(name)
    output = np.asarray(_call(layer, x, causal, segment_ids), np.float64)
    for row, start, stop in documents:
        alone = x[row : row + 1, start:stop].astype(np.float64)
        expected = _float64_reference(name, layer, alone, None, causal)[0]
        np.testing.assert_allclose(output[row : row + 1, start:stop], expected, atol=ATOL["float32"])
    assert np.all(output[segment_ids == 0] == 0)


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
@pytest.mark.parametrize("name,causal", CASES)
def test_packed_outputs_and_gradients_equal_each_document_alone(name, causal, policy, jit_compile):
    x, segment_ids, documents = _packed_row(1)
    layer = _family(name, policy)
    layer.build((None, None, HIDDEN))  # its weights exist before the compiled call
    cotangent = np.random.default_rng(2).standard_normal((2, LENGTH, HIDDEN)).astype("float32")
    output, input_gradient, weight_gradients = _output_and_gradients(
        layer, x, causal, cotangent, segment_ids, jit_compile
    )
    expected_weight_gradients = [np.zeros_like(g) for g in weight_gradients]
    for row, start, stop in documents:
        piece = np.s_[row : row + 1, start:stop]
        alone, alone_input_gradient, alone_weight_gradients = _output_and_gradients(
            layer, x[piece], causal, cotangent[piece]
        )
        np.testing.assert_allclose(output[piece], alone, atol=ATOL[policy], err_msg="output")
        np.testing.assert_allclose(input_gradient[piece], alone_input_gradient, atol=ATOL[policy], err_msg="input")
        for total, gradient in zip(expected_weight_gradients, alone_weight_gradients):
            total += gradient
    scale = max(np.abs(g).max() for g in expected_weight_gradients)
    for index, (got, want) in enumerate(zip(weight_gradients, expected_weight_gradients)):
        np.testing.assert_allclose(got, want, atol=ATOL[policy] * scale, err_msg=f"weight gradient {index}")
    padding = segment_ids == 0
    assert np.all(output[padding] == 0) and np.all(input_gradient[padding] == 0)


@pytest.mark.parametrize("name", PACKED)
def test_a_document_never_sees_another_documents_content(name):
    x, segment_ids, _ = _packed_row(3)
    layer = _family(name)
    changed = x.copy()
    changed[segment_ids == 2] = 100.0 * np.random.default_rng(4).standard_normal((12, HIDDEN))
    before, after = (np.asarray(layer(inputs, segment_ids=segment_ids)) for inputs in (x, changed))
    other = segment_ids != 2
    np.testing.assert_allclose(after[other], before[other], atol=1e-6)
    assert not np.allclose(after[segment_ids == 2], before[segment_ids == 2], atol=1e-3)


@pytest.mark.parametrize("name", REFUSING)
def test_a_family_without_segments_refuses_them_saying_why(name):
    family = FAMILIES[name]
    why = family.capabilities.why_not("segments")
    assert "segment_ids" in why, "a family that cannot take packed rows declares why, naming `segment_ids`"
    x, segment_ids, _ = _packed_row()
    x, segment_ids = np.nan_to_num(x[:, :9]), segment_ids[:, :9]  # within Linformer's `max_length`
    with pytest.raises(ValueError, match=rf"{family.__name__} does not support segments") as error:
        _family(name)(x, segment_ids=segment_ids)
    assert why in str(error.value) and "(2, 9)" in str(error.value)


@pytest.mark.parametrize("name", PACKED)
def test_bad_segment_ids_are_named(name):
    x, segment_ids, _ = _packed_row()
    layer, x = _family(name), np.nan_to_num(x)
    with pytest.raises(ValueError, match=r"`segment_ids` must be integer .* Received: segment_ids.dtype=float32"):
        layer(x, segment_ids=segment_ids.astype("float32"))
    with pytest.raises(ValueError, match=r"`segment_ids` must have one id per token \(21\)"):
        layer(x, segment_ids=segment_ids[:, :-1])


def test_the_capabilities_table_lists_segments():
    header, _, *rows = attention_families.capabilities_table().splitlines()
    assert header.endswith("| segments |")
    for (name, family), row in zip(FAMILIES.items(), rows):
        assert row.endswith(f"| {'yes' if family.capabilities.segments else 'no'} |"), name


def test_keras_functional_model_takes_segment_ids():
    """The ids are a model input like the tokens: the graph the apps build."""
    for name in PACKED:
        layer = _family(name)
        inputs, ids = keras.Input((None, HIDDEN)), keras.Input((None,), dtype="int32")
        model = keras.Model([inputs, ids], layer(inputs, segment_ids=ids))
        x, segment_ids, _ = _packed_row(5)
        x = np.nan_to_num(x)
        np.testing.assert_allclose(model([x, segment_ids]), layer(x, segment_ids=segment_ids), atol=1e-6)


# Each family's richest mode in `make test` (causal where it has one); its other mode is `slow`.
EXPORT_CASES = [
    pytest.param(name, causal, marks=[pytest.mark.slow] if causal != FAMILIES[name].capabilities.causal else [])
    for name, causal in CASES
]


@pytest.mark.parametrize("name,causal", EXPORT_CASES)
def test_packed_family_exports_to_onnx_equal_to_keras(name, causal, tmp_path):
    """Dynamic batch and length, as every export converts (`export.onnx_conversion.OPSET`)."""
    layer = _family(name)
    inputs, ids = keras.Input((None, HIDDEN)), keras.Input((None,), dtype="int32")
    model = keras.Model([inputs, ids], layer(inputs, segment_ids=ids, use_causal_mask=causal))
    signature = [
        tf.TensorSpec([None, None, HIDDEN], tf.float32, name="x"),
        tf.TensorSpec([None, None], tf.int32, name="segment_ids"),
    ]
    predict = tf.function(lambda x, segment_ids: model([x, segment_ids]), input_signature=signature)
    path = tmp_path / "model.onnx"
    tf2onnx.convert.from_function(predict, input_signature=signature, opset=OPSET, output_path=str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x, segment_ids, _ = _packed_row(6)
    x = np.nan_to_num(x)
    (got,) = session.run(None, {"x": x, "segment_ids": segment_ids})
    np.testing.assert_allclose(got, model([x, segment_ids]), atol=1e-5)
