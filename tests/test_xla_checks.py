"""No Assert op in what XLA compiles of keras_attn's layers, and what each run-time check does there.

TensorFlow drops an Assert op inside an XLA cluster (logging "Ignoring Assert operator"), so a
check written as one would let bad data through silently. keras_attn's checks assert outside XLA
(a clear `InvalidArgumentError`) and, under XLA, make the guarded output NaN instead
(`keras_attn.utils.asserted`, `nan_unless`; the list is in docs/guides/kernels.md). The oracles:
the Assert ops TensorFlow traces, its own log, and the same call outside XLA.
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from tests.markdown_examples import python_examples

REPO_ROOT = Path(__file__).resolve().parents[1]
_IGNORED = "Ignoring Assert operator"
_CONTROL = """
@tf.function(jit_compile=True)
def control(x):
    with tf.control_dependencies([tf.debugging.Assert(x > 0, ["x"])]):
        return tf.identity(x)


control(tf.constant(1.0))
"""
S = tf.TensorSpec


def _assert_ops(function, *specs):
    """The names of the Assert ops of `function` traced for `specs`, its nested functions included."""
    graphs, seen, names = [function.get_concrete_function(*specs).graph], set(), []
    while graphs:
        graph = graphs.pop()
        names += [op.name for op in graph.get_operations() if op.type == "Assert"]
        for nested in graph._functions.values():
            if getattr(nested, "graph", None) is not None and id(nested.graph) not in seen:
                seen.add(id(nested.graph))
                graphs.append(nested.graph)
    return names


def test_readme_example_compiled_with_xla_logs_no_ignored_assert():
    """The README's first example (`jit_compile=True`) in a process of its own, its C++ log read;
    then a function with an Assert, which must log the line (the log is captured)."""
    name, code = python_examples(REPO_ROOT / "README.md")[0]
    assert name == "example-1" and "jit_compile=True" in code
    script = f"{code}\nprint('--- control ---', flush=True)\nimport tensorflow as tf\n{_CONTROL}\n"
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, cwd=REPO_ROOT, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--- control ---" in run.stdout
    # The C++ log and Python's stdout interleave only at exit; the control's line is its own op's.
    lines = [line for line in run.stderr.splitlines() if _IGNORED in line]
    assert lines, "the control's Assert did not log: the log is not captured"
    assert all("Assert/Assert" in line and "functional" not in line for line in lines), lines
    assert len(lines) == 1, lines


def _readme_model():
    token_ids = keras.Input(shape=(None,), dtype="int32")
    x = keras_attn.TokenAndPositionEmbedding(vocabulary_size=50, sequence_length=16, embedding_dim=8)(token_ids)
    x = keras_attn.TransformerEncoder(intermediate_dim=16, num_heads=2)(x)
    x = keras_attn.MaskedGlobalPooling("mean")(x)
    return keras.Model(token_ids, keras.layers.Dense(1)(x))


def _traced_calls():
    """`{name: (function of tensors, specs, has a check outside XLA)}`: the default paths."""
    model = _readme_model()
    causal = keras_attn.CausalSelfAttention(num_heads=2, key_dim=4)
    causal(tf.zeros((1, 8, 8)))
    window = keras_attn.CausalSelfAttention(num_heads=2, key_dim=4, sliding_window=4)
    window(tf.zeros((1, 8, 8)))
    attention = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    attention(tf.zeros((1, 8, 8)), tf.zeros((1, 8, 8)))
    embedding = keras_attn.TokenAndPositionEmbedding(50, 16, 8)
    pooling = keras_attn.MaskedGlobalPooling("mean", max_documents=3)
    linformer = keras_attn.LinformerSelfAttention(num_heads=2, key_dim=4, max_length=8, projected_length=4)
    linformer(tf.zeros((1, 8, 8)))
    ids, length = S((2, None), tf.int32), S((2, None, 8))
    return {
        "readme model": (lambda t: model(t), (ids,), True),
        "auto dispatcher, dynamic length": (lambda x: causal(x), (S((1, None, 8)),), False),
        "cached decoding": (
            lambda x, c, i: causal(x, cache=c, cache_update_index=i),
            (S((1, 1, 8)), S((1, 2, 8, 2, 4)), S((), tf.int32)),
            True,
        ),
        "ring buffer decoding": (
            lambda x, c, i: window(x, cache=c, cache_update_index=i),
            (S((1, 1, 8)), S((1, 2, 4, 2, 4)), S((), tf.int32)),
            False,
        ),
        "segment ids": (lambda x, s: attention(x, x, segment_ids=s), (length, ids), False),
        "positions from start_index": (lambda t, i: embedding(t, start_index=i), (ids, S((), tf.int32)), True),
        "given positions": (lambda t, p: embedding(t, positions=p), (ids, ids), True),
        "positions within documents": (lambda t, s: embedding(t, segment_ids=s), (ids, ids), True),
        "pooling per document": (lambda x, s: pooling(x, segment_ids=s), (length, ids), True),
        "linformer, dynamic length": (lambda x: linformer(x), (S((1, None, 8)),), True),
    }


@pytest.mark.parametrize("name", list(_traced_calls()))
def test_no_assert_op_where_xla_compiles_and_the_checks_stay_outside(name):
    call, specs, checked = _traced_calls()[name]
    assert _assert_ops(tf.function(call, jit_compile=True), *specs) == []
    assert bool(_assert_ops(tf.function(call), *specs)) == checked  # the clear error outside XLA


def _decoding_steps(jit_compile):
    layer = keras_attn.CausalSelfAttention(num_heads=2, key_dim=4)
    sequence = keras.random.normal((2, 4, 8), seed=0)
    layer(sequence)
    step = tf.function(lambda x, c, i: layer(x, cache=c, cache_update_index=i), jit_compile=jit_compile)
    cache = layer.initial_cache(2, 4)
    outputs = []
    for index in range(4):
        output, cache = step(sequence[:, index : index + 1], cache, tf.constant(index))
        outputs.append(output)
    return step, sequence, cache, outputs


@pytest.mark.parametrize("index", [4, -1])
def test_under_xla_a_write_past_the_cache_outputs_nan_and_overwrites_nothing(index):
    step, sequence, cache, outputs = _decoding_steps(jit_compile=True)
    assert not np.isnan(np.asarray(keras.ops.stack(outputs))).any()
    output, after = step(sequence[:, :1], cache, tf.constant(index))
    assert np.all(np.isnan(np.asarray(output)))
    np.testing.assert_array_equal(np.asarray(after), np.asarray(cache))


@pytest.mark.parametrize("index", [4, -1])
def test_outside_xla_a_write_past_the_cache_is_an_error(index):
    step, sequence, cache, _ = _decoding_steps(jit_compile=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="cache_update_index"):
        step(sequence[:, :1], cache, tf.constant(index))


def test_under_xla_positions_past_the_table_give_nan():
    layer = keras_attn.TokenAndPositionEmbedding(10, 4, 8)
    ids = np.array([[1, 2]])
    layer(ids)
    compiled = tf.function(lambda t, i: layer(t, start_index=i), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(ids, tf.constant(2))), np.asarray(layer(ids, start_index=2)))
    assert np.all(np.isnan(np.asarray(compiled(ids, tf.constant(3)))))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_length=4"):
        tf.function(lambda t, i: layer(t, start_index=i))(ids, tf.constant(3))


def test_under_xla_a_segment_id_past_max_documents_gives_nan():
    pooling = keras_attn.MaskedGlobalPooling("mean", max_documents=2)
    inputs = np.ones((1, 3, 4), "float32")
    compiled = tf.function(lambda x, s: pooling(x, segment_ids=s), jit_compile=True)
    good = np.array([[1, 2, 2]])
    np.testing.assert_allclose(np.asarray(compiled(inputs, good)), np.asarray(pooling(inputs, segment_ids=good)))
    assert np.all(np.isnan(np.asarray(compiled(inputs, np.array([[1, 2, 3]])))))


def test_under_xla_linformer_past_max_length_gives_nan():
    layer = keras_attn.LinformerSelfAttention(num_heads=2, key_dim=4, max_length=4, projected_length=2)
    layer(tf.zeros((1, 4, 8)))
    compiled = tf.function(lambda x: layer(x), jit_compile=True, input_signature=[S((1, None, 8))])
    assert not np.isnan(np.asarray(compiled(tf.ones((1, 3, 8))))).any()
    assert np.all(np.isnan(np.asarray(compiled(tf.ones((1, 5, 8))))))
