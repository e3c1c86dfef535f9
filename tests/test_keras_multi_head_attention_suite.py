"""Keras's own `MultiHeadAttention` test file, run against `keras_attn.MultiHeadAttention`.

The test module is loaded from the installed keras package (nothing of it is copied here); its
`layers` namespace is swapped for one whose `MultiHeadAttention` is ours, so every test builds,
calls, saves and quantizes our layer exactly as it does Keras's. Every test must pass: there is
no expected failure (our one deliberate difference, zero weights for a fully masked query row,
is not exercised by Keras's file).

Most Keras wheels ship no tests (3.10, the oldest supported, does not): `KERAS_MHA_TEST_FILE` names
the file of the installed release's tag in Keras's source tree instead, e.g. in `make test-compat`'s
venv `KERAS_MHA_TEST_FILE=<keras v3.10.0>/keras/src/layers/attention/multi_head_attention_test.py`.
"""

import importlib.util
import os
import types
from pathlib import Path

import keras
import pytest

import keras_attn

KERAS_TEST_FILE = Path(
    os.environ.get(
        "KERAS_MHA_TEST_FILE",
        Path(keras.__file__).parent / "src" / "layers" / "attention" / "multi_head_attention_test.py",
    )
)
# The tests in Keras's file of each release it has run against; on TensorFlow 2 flash-attention
# tests of each skip (for Keras's own class too): 3.15.1 runs 48, 3.10.0 runs 34.
KERAS_TEST_COUNTS = {"3.15.1": 50, "3.10.0": 36}


def _load_keras_test_module():
    if not KERAS_TEST_FILE.is_file():  # the apps' pinned wheel ships it; some releases' wheels do not
        pytest.skip(f"keras {keras.__version__} ships no {KERAS_TEST_FILE}", allow_module_level=True)
    spec = importlib.util.spec_from_file_location("keras_multi_head_attention_test", KERAS_TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    our_layers = types.ModuleType("keras_layers_with_keras_attn_mha")
    our_layers.__dict__.update(vars(module.layers))
    our_layers.MultiHeadAttention = keras_attn.MultiHeadAttention
    module.layers = our_layers
    return module


_keras_tests = _load_keras_test_module()


class TestKerasMultiHeadAttentionSuite(_keras_tests.MultiHeadAttentionTest):
    """Every test of Keras's file, on `keras_attn.MultiHeadAttention`."""


def test_the_whole_keras_file_runs_on_our_class():
    tests = [name for name in dir(TestKerasMultiHeadAttentionSuite) if name.startswith("test")]
    assert len(tests) == KERAS_TEST_COUNTS[keras.__version__], f"{len(tests)} tests in {KERAS_TEST_FILE}"
    assert _keras_tests.layers.MultiHeadAttention is keras_attn.MultiHeadAttention
    assert _keras_tests.layers.Dense is keras.layers.Dense
