"""A converted layer's traced graph does Keras's work plus a constant: structural checks, not timings.

`benchmarks.graph_ops` traces the same step of a model as built and after `keras_attn.convert`
(same weights) and counts the op types of both graphs; these tests hold its findings at tiny sizes:
no select, transpose, tile or cast over the keys, values or logits that Keras's graph does not have,
and at most a fixed number of small ops more. The bounds are per attention layer and do not grow
with the length: they are what our semantics add on purpose (listed at each bound).
"""

import argparse

import pytest

from benchmarks import graph_ops

# Ops that do no arithmetic: constants, the traced function's own inputs and identities.
_FREE = ("Const", "Placeholder", "NoOp", "Identity", "ReadVariableOp", "VarHandleOp")
# Passes over a whole tensor that a lean path has no reason to add: Keras's count is the ceiling.
_COPIES = ("Tile", "Transpose", "BroadcastTo", "Cast", "MatrixDiagV3")
# The softmax with the exact gradient of saturated rows (`softmax_with_exact_saturated_gradient`): its
# `custom_gradient` wrapper (IdentityN) and, in the backward pass, the row sum of the weights and its
# product with the upstream gradient: 3 ops.
_EXACT_SOFTMAX = 3
# A query row whose keys are all masked outputs zero (the layer's contract): a boolean `any` over the
# mask, its transpose and expansion to the output's layout and one select on the (batch, query_len,
# heads, depth) output, whose gradient is two selects and a zero fill: 7 ops, none over the logits.
_EMPTY_ROWS = 7
# A converted layer's check for query rows without keys in a decoding step (listed at its use).
_KERAS_ROWS_CHECK = 18


def _arguments(**overrides):
    defaults = dict(length=16, batch=2, width=16, heads=2, layers=1, vocabulary=50)
    return argparse.Namespace(**{**defaults, **overrides})


def _work(counts):
    """The op counts without the ops that do no work."""
    return {op: count for op, count in counts.items() if op not in _FREE}


def _compare(traced):
    """`(ours, keras)`: the work-op counts of the converted and the original variant's graph."""
    counts = {variant: _work(graph_ops.op_counts(graph)) for variant, graph in traced.items()}
    return counts["converted"], counts["keras"]


def _assert_lean(ours, keras, allowance, layers=1, copies=1):
    added = {op: ours.get(op, 0) - keras.get(op, 0) for op in set(ours) | set(keras)}
    assert sum(ours.values()) <= sum(keras.values()) + allowance * layers, {op: n for op, n in added.items() if n}
    for op in _COPIES:
        assert ours.get(op, 0) <= keras.get(op, 0) + copies * layers, (op, added)  # small ones, a layer


def _training_graphs(name, args):
    return {
        variant: graph_ops.training_graph(model, inputs)
        for variant, (model, inputs) in graph_ops._variants(name, args).items()
    }


def test_an_unmasked_converted_layer_trains_with_keras_graph_plus_the_exact_softmax():
    """Keras's layer with dropout 0.1 (KerasHub BERT's), no mask: no select at all, no copy of a tensor."""
    ours, keras = _compare(_training_graphs("layer", _arguments()))
    _assert_lean(ours, keras, _EXACT_SOFTMAX)
    assert ours.get("SelectV2", 0) == keras.get("SelectV2", 0)  # no mask: no select over the keys or the logits


def test_a_padded_converted_layer_adds_only_the_zero_output_of_empty_rows():
    """With a padding mask: Keras's one select on the logits, ours plus the output's empty-row zeroing
    (no select over the keys and values: the layer zeroed the padded inputs before the projections)."""
    ours, keras = _compare(_training_graphs("layer_padded", _arguments()))
    _assert_lean(ours, keras, _EXACT_SOFTMAX + _EMPTY_ROWS)
    assert ours.get("SelectV2", 0) <= keras.get("SelectV2", 0) + 3  # the empty-row select and its gradient's two


@pytest.mark.parametrize("name", ["gpt2", "gemma"])
def test_a_converted_causal_lm_decoding_step_is_keras_graph_plus_a_constant(name):
    """One cached step of `generate` (`call_with_cache`) at batch 4 against a 16-position cache: no
    repeat of Gemma's single key/value head over the cache, no select over the cache, no copy."""
    pytest.importorskip("keras_hub")
    args = _arguments(batch=4, heads=4, layers=2)
    traced = {
        variant: graph_ops.decoding_graph(model, name, args)
        for variant, (model, _) in graph_ops._variants(name, args).items()
    }
    ours, keras = _compare(traced)
    # A decoding step has no backward pass. A converted layer keeps Keras's output for a query row
    # with no allowed key (`rows_without_keys="keras"`): whether any row of the step's boolean mask
    # is empty (any, all, their transposes, expansions and reshapes over `(batch, heads, 1, key_len)`
    # booleans, and the `cond`: 18 small ops), and the branch taken only when one is, which the count
    # includes though it does not run (the mean over the values, its repeat over grouped heads, a
    # cast and a select: 4 ops); the softmax's `custom_gradient` wrapper (1 op) a layer.
    # Two of the check's ops are transposes of those booleans. The two products run on Keras's
    # `ops.einsum` (which the ONNX attention fuser matches): transposes of the query, the cached keys
    # and values and the output around the matmuls, 6 a layer where Keras's `tf.einsum` has none.
    # They pass over the cache: the open cost of issue #50 item 5 until the fuser matches an Einsum.
    _assert_lean(ours, keras, _KERAS_ROWS_CHECK + 4 + 1 + 6, layers=args.layers, copies=7)
    assert ours.get("Tile", 0) <= keras.get("Tile", 0) + args.layers  # the untaken branch's repeat alone
    assert ours.get("SelectV2", 0) <= keras.get("SelectV2", 0) + 2 * args.layers


def test_zero_unattended_keys_false_drops_exactly_the_two_selects_over_keys_and_values():
    import numpy as np
    import tensorflow as tf

    from keras_attn import scaled_dot_product_attention

    q = tf.TensorSpec((2, 4, 2, 3), "float32")
    mask = np.arange(4)[None, None, None, :] < np.array([4, 2])[:, None, None, None]  # padded keys in row 2

    def selects(zero):
        traced = tf.function(lambda q: scaled_dot_product_attention(q, q, q, mask=mask, zero_unattended_keys=zero))
        return graph_ops.op_counts(traced.get_concrete_function(q))["SelectV2"]

    assert selects(True) - selects(False) == 2
    with pytest.raises(ValueError, match="zero_unattended_keys"):
        scaled_dot_product_attention(
            np.ones((1, 2, 1, 2), "float32"), *[np.ones((1, 2, 1, 2), "float32")] * 2, zero_unattended_keys="no"
        )
