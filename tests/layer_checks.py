"""Generic checks that every keras_attn layer test reuses.

Each check takes a model (or a factory that builds one) and concrete inputs and asserts one
contract against an independent oracle: the same model reloaded, rebuilt from its config, run
in float32, run eagerly, or differentiated numerically.

Inputs convention (the same for every check):

- a single array: passed as the one positional argument, `fn(x)`;
- a tuple: splatted as positional arguments, `fn(*inputs)` (multi-input layers such as
  `MultiHeadAttention(query, value)`);
- a list or a dict: passed as one argument, `fn(inputs)` (multi-input functional models).

Outputs may be a tensor or any nested structure of tensors (`(output, scores)`); every leaf is
compared.
"""

import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

# Max abs error allowed against float32, relative to max(1, max |float32 output|).
MIXED_PRECISION_TOLERANCES = {"mixed_float16": 2e-2, "mixed_bfloat16": 8e-2}


def call_with(fn, inputs, **kwargs):
    """Calls `fn` following the inputs convention of this module."""
    if isinstance(inputs, tuple):
        return fn(*inputs, **kwargs)
    return fn(inputs, **kwargs)


def to_numpy_leaves(outputs):
    """Every leaf of a (nested) output as a float64 NumPy array."""
    return [np.asarray(keras.ops.convert_to_numpy(leaf), np.float64) for leaf in keras.tree.flatten(outputs)]


def assert_outputs_close(actual, expected, atol=1e-6, rtol=0.0, what="outputs"):
    """Asserts two (nested) outputs have the same structure, shapes and values."""
    actual, expected = to_numpy_leaves(actual), to_numpy_leaves(expected)
    assert len(actual) == len(expected), f"{what}: {len(actual)} leaves != {len(expected)}"
    for index, (got, want) in enumerate(zip(actual, expected)):
        assert got.shape == want.shape, f"{what}[{index}]: shape {got.shape} != {want.shape}"
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"{what}[{index}]")


def _cast_floats(inputs, dtype):
    """Casts the floating leaves of `inputs` to `dtype`; ints and bools are left alone."""

    def cast(leaf):
        array = np.asarray(keras.ops.convert_to_numpy(leaf))
        return array.astype(dtype) if np.issubdtype(array.dtype, np.floating) else array

    return keras.tree.map_structure(cast, inputs)


def _build_model(model_or_factory):
    if isinstance(model_or_factory, keras.layers.Layer):
        return model_or_factory
    return model_or_factory()


def assert_config_round_trip(layer):
    """`from_config(get_config())` rebuilds a layer whose config is identical."""
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config


def assert_serialization_round_trip(model_or_factory, inputs, atol=1e-6):
    """A `.keras` save/load and a config round trip reproduce the model's outputs exactly.

    Args:
        model_or_factory: a built `keras.Model`, or a zero-argument callable returning one.
        inputs: concrete inputs (see the module docstring).
        atol: max abs difference allowed (the same weights must give the same numbers).

    The config round trip goes through `keras.saving.serialize_keras_object` /
    `deserialize_keras_object` (so registration is exercised), then copies the weights. Every
    layer's own config must also round-trip unchanged.
    """
    model = _build_model(model_or_factory)
    expected = call_with(model, inputs, training=False)
    for layer in model._flatten_layers(include_self=False):
        assert_config_round_trip(layer)

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
    assert_outputs_close(call_with(reloaded, inputs, training=False), expected, atol=atol, what="reloaded")

    rebuilt = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    call_with(rebuilt, inputs, training=False)  # builds the variables
    rebuilt.set_weights(model.get_weights())
    assert_outputs_close(call_with(rebuilt, inputs, training=False), expected, atol=atol, what="from_config")
    return reloaded


def assert_mixed_precision_close(factory, inputs, policies=tuple(MIXED_PRECISION_TOLERANCES), tolerances=None):
    """Under each mixed policy the model is finite and close to float32 with the same weights.

    Args:
        factory: zero-argument callable that builds the model/layer under the current global
            dtype policy (it is called once per policy).
        inputs: concrete float32 inputs (see the module docstring).
        policies: mixed policies to check.
        tolerances: `{policy: tolerance}` overriding `MIXED_PRECISION_TOLERANCES`; the max abs
            error allowed is `tolerance * max(1, max |float32 output|)`.

    The global dtype policy is restored afterwards, whatever happens.
    """
    tolerances = {**MIXED_PRECISION_TOLERANCES, **(tolerances or {})}
    previous = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("float32")
        reference_model = factory()
        expected = to_numpy_leaves(call_with(reference_model, inputs, training=False))
        for policy in policies:
            keras.config.set_dtype_policy(policy)
            model = factory()
            call_with(model, inputs, training=False)  # builds the variables
            floating = [w for w in model.weights if "float" in w.dtype]  # integer variables keep their type
            assert all(w.dtype == "float32" for w in floating), f"{policy}: variables must stay float32"
            model.set_weights(reference_model.get_weights())
            actual = to_numpy_leaves(call_with(model, inputs, training=False))
            for index, (got, want) in enumerate(zip(actual, expected)):
                assert np.all(np.isfinite(got)), f"{policy}: output {index} is not finite"
                tolerance = tolerances[policy] * max(1.0, float(np.max(np.abs(want))))
                np.testing.assert_allclose(got, want, atol=tolerance, rtol=0, err_msg=f"{policy} output {index}")
    finally:
        keras.config.set_dtype_policy(previous)


def assert_jit_matches_eager(fn, inputs, atol=1e-5, **call_kwargs):
    """`fn` gives the same outputs eagerly, in a `tf.function` graph and XLA-compiled.

    Args:
        fn: a built layer/model or any callable of keras ops.
        inputs: concrete inputs (see the module docstring).
        atol: max abs difference allowed (XLA may reorder float32 sums).
        **call_kwargs: extra keyword arguments for every call (`training=False`, masks, ...).
    """
    expected = call_with(fn, inputs, **call_kwargs)
    positional = inputs if isinstance(inputs, tuple) else (inputs,)
    for jit_compile in (False, True):
        compiled = tf.function(lambda *args: fn(*args, **call_kwargs), jit_compile=jit_compile)
        actual = compiled(*positional)
        assert_outputs_close(actual, expected, atol=atol, what=f"tf.function(jit_compile={jit_compile})")


def _directional_derivative_error(loss_fn, variables, rng, epsilon):
    """Relative error between `grad . d` (autodiff) and a central difference along `d`."""
    with tf.GradientTape() as tape:
        loss = loss_fn()
    # Embedding tables get `IndexedSlices`: densify them.
    gradients = [None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
    for variable, gradient in zip(variables, gradients):
        assert gradient is not None, f"no gradient for {variable.name}"
        assert np.all(np.isfinite(gradient.numpy())), f"non-finite gradient for {variable.name}"
    directions = [rng.standard_normal(v.shape) for v in variables]
    analytic = sum(float(np.sum(g.numpy() * d)) for g, d in zip(gradients, directions))
    originals = [v.numpy() for v in variables]

    def loss_at(step):
        for variable, original, direction in zip(variables, originals, directions):
            variable.assign(original + step * direction)
        return float(loss_fn())

    numeric = (loss_at(epsilon) - loss_at(-epsilon)) / (2 * epsilon)
    loss_at(0.0)
    return abs(analytic - numeric) / max(1.0, abs(numeric)), analytic, numeric


def assert_gradients_match_finite_differences(factory, inputs, directions=3, epsilon=1e-5, rtol=1e-6, **call_kwargs):
    """Float64 autodiff gradients (inputs and weights) match central finite differences.

    Args:
        factory: zero-argument callable building the model/layer; it is called with the global
            policy and `floatx` set to float64, so the layer computes in float64.
        inputs: small concrete inputs (see the module docstring); floating leaves are cast to
            float64 and differentiated, ints/bools are passed unchanged.
        directions: number of random directions checked for the weights and for the inputs.
        epsilon: central-difference step.
        rtol: max error relative to max(1, |finite difference|).
        **call_kwargs: extra keyword arguments for every call (masks, `use_causal_mask`, ...).

    The loss is `sum(output * c)` for a fixed random `c`, so every output element matters.
    All gradients must also be finite.
    """
    previous_policy, previous_floatx = keras.config.dtype_policy(), keras.config.floatx()
    rng = np.random.default_rng(0)
    try:
        keras.config.set_floatx("float64")
        keras.config.set_dtype_policy("float64")
        model = factory()
        inputs = _cast_floats(inputs, np.float64)
        leaves = keras.tree.flatten(inputs)
        input_variables = [tf.Variable(leaf) if leaf.dtype == np.float64 else leaf for leaf in leaves]
        structured = keras.tree.pack_sequence_as(inputs, input_variables)
        output_leaves = keras.tree.flatten(call_with(model, structured, training=False, **call_kwargs))
        cotangents = [rng.standard_normal(tuple(o.shape)) for o in output_leaves]

        def loss_fn():
            outputs = keras.tree.flatten(call_with(model, structured, training=False, **call_kwargs))
            return sum(tf.reduce_sum(tf.cast(o, tf.float64) * c) for o, c in zip(outputs, cotangents))

        differentiable_inputs = [v for v in input_variables if isinstance(v, tf.Variable)]
        weights = list(getattr(model, "trainable_weights", []))
        for name, variables in (("inputs", differentiable_inputs), ("weights", weights)):
            if not variables:
                continue
            for _ in range(directions):
                error, analytic, numeric = _directional_derivative_error(loss_fn, variables, rng, epsilon)
                assert error <= rtol, f"{name}: autodiff {analytic!r} != finite difference {numeric!r}"
    finally:
        keras.config.set_floatx(previous_floatx)
        keras.config.set_dtype_policy(previous_policy)


def assert_fit_one_step(model, x, y, loss="mse", learning_rate=1e-2, unchanged_ok=()):
    """One `model.fit` step gives a finite loss and moves every trainable weight.

    Args:
        model: an uncompiled, built `keras.Model`.
        x, y: one small batch.
        loss: a Keras loss.
        unchanged_ok: substrings of weight paths allowed to keep their value (weights whose
            gradient is mathematically zero, e.g. a key bias under softmax shift invariance).
    """
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss)
    before = {w.path: w.numpy().copy() for w in model.trainable_weights}
    history = model.fit(x, y, batch_size=len(keras.tree.flatten(x)[0]), epochs=1, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), f"loss is not finite: {losses}"
    unchanged = [
        path
        for path, value in before.items()
        if np.array_equal(value, _weight_by_path(model, path)) and not any(s in path for s in unchanged_ok)
    ]
    assert not unchanged, f"weights unchanged by one training step: {unchanged}"
    return losses[0]


def _weight_by_path(model, path):
    return next(w.numpy() for w in model.trainable_weights if w.path == path)


def padded_token_ids(rng, lengths, width, vocabulary_size):
    """Int32 ids `(len(lengths), width)` in [1, vocabulary_size), 0-padded after each row's length."""
    ids = rng.integers(1, vocabulary_size, size=(len(lengths), width)).astype("int32")
    ids[np.arange(width)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return ids


def output_gradients(function, inputs, output_grad):
    """Gradients of `sum(function(*inputs) * output_grad)` with respect to every input, as NumPy.

    The output is cast to `output_grad`'s dtype, so half-precision functions can be checked
    against a float32 or float64 cotangent.
    """
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = tf.reduce_sum(tf.cast(function(*inputs), output_grad.dtype) * output_grad)
    return [g.numpy() for g in tape.gradient(loss, inputs)]


def assert_padding_invariant(layer, x, mask, appended=3, atol=1e-5):
    """Padded content and appended padding never change the real outputs; padded rows are zero.

    Args:
        layer: a self-attention layer called as `layer(x, query_mask=mask, value_mask=mask)`, without an output bias
            (so that a zero attention output is a zero output).
        x: `(batch, seq, features)` float32 inputs.
        mask: boolean `(batch, seq)` with some padding; no sequence may be all padding.
    """
    mask = np.asarray(mask, bool)
    output = np.asarray(layer(x, query_mask=mask, value_mask=mask))
    changed = np.where(mask[..., None], x, np.float32(40.0))
    np.testing.assert_allclose(
        np.asarray(layer(changed, query_mask=mask, value_mask=mask))[mask], output[mask], atol=atol, err_msg="content"
    )
    batch, _, features = x.shape
    longer = np.concatenate([x, np.ones((batch, appended, features), x.dtype)], axis=1)
    longer_mask = np.concatenate([mask, np.zeros((batch, appended), bool)], axis=1)
    longer_output = np.asarray(layer(longer, query_mask=longer_mask, value_mask=longer_mask))[:, : x.shape[1]]
    np.testing.assert_allclose(longer_output[mask], output[mask], atol=atol, err_msg="appended padding")
    assert np.all(output[~mask] == 0), "padded rows must be zero"
    assert np.all(np.asarray(layer(x, query_mask=np.zeros_like(mask), value_mask=np.zeros_like(mask))) == 0), (
        "an all-padding sequence must give zeros"
    )


def _symbolic(inputs):
    """`keras.KerasTensor`s with the shapes (batch axis free) and dtypes of concrete `inputs`."""

    def symbolic(leaf):
        array = np.asarray(keras.ops.convert_to_numpy(leaf))
        return keras.KerasTensor((None, *array.shape[1:]), dtype=str(array.dtype))

    return keras.tree.map_structure(symbolic, inputs)


def _functional_model(layer_class, init_kwargs, inputs, call_kwargs):
    symbolic = _symbolic(inputs)
    model_inputs = [keras.Input(batch_shape=leaf.shape, dtype=leaf.dtype) for leaf in keras.tree.flatten(symbolic)]
    structured = keras.tree.pack_sequence_as(symbolic, model_inputs)
    outputs = call_with(layer_class(**init_kwargs), structured, **call_kwargs)
    return keras.Model(model_inputs, outputs)


def run_layer_test(
    layer_class,
    init_kwargs,
    inputs,
    call_kwargs=None,
    expected_num_trainable_weights=None,
    expected_num_non_trainable_weights=0,
    run_training=True,
    mixed_precision_tolerances=None,
    unchanged_ok=(),
):
    """The contract every public layer keeps, in one call (the idea of KerasHub's `run_layer_test`).

    1. config round trip, also through JSON (`serialize_keras_object` -> `json` -> back);
    2. a symbolic `KerasTensor` call whose outputs (one tensor or a tuple) have the eager
       outputs' shapes and dtypes, and `compute_output_shape` agreeing where the layer has one;
    3. the number of trainable and non-trainable weights;
    4. mixed precision (`mixed_float16`, `mixed_bfloat16`) close to float32 with the same weights;
    5. eager, `tf.function` and XLA (`jit_compile=True`) give the same outputs;
    6. one `fit` step of a functional model around the layer moves every trainable weight;
    7. a `.keras` save/load and a config rebuild of that model give the same outputs.

    Args:
        layer_class: the layer class.
        init_kwargs: constructor arguments.
        inputs: concrete inputs, following this module's inputs convention.
        call_kwargs: extra call arguments (`use_causal_mask=True`, `return_attention_scores=True`).
        expected_num_trainable_weights, expected_num_non_trainable_weights: weight counts.
        run_training: whether to run the `fit` step (layers without weights skip it).
        mixed_precision_tolerances: `{policy: tolerance}` for `assert_mixed_precision_close`.
        unchanged_ok: weight path substrings allowed not to move in the `fit` step.
    """
    call_kwargs = dict(call_kwargs or {})
    layer = layer_class(**init_kwargs)
    assert_config_round_trip(layer)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    assert keras.saving.deserialize_keras_object(serialized).get_config() == layer.get_config()

    eager = call_with(layer, inputs, **call_kwargs)
    symbolic = call_with(layer_class(**init_kwargs), _symbolic(inputs), **call_kwargs)
    eager_leaves, symbolic_leaves = keras.tree.flatten(eager), keras.tree.flatten(symbolic)
    assert len(symbolic_leaves) == len(eager_leaves), f"{len(symbolic_leaves)} symbolic outputs for {len(eager_leaves)}"
    for index, (spec, value) in enumerate(zip(symbolic_leaves, eager_leaves)):
        assert tuple(spec.shape)[1:] == tuple(value.shape)[1:], f"output {index}: {spec.shape} vs {value.shape}"
        assert keras.backend.standardize_dtype(spec.dtype) == keras.backend.standardize_dtype(value.dtype), index
    if type(layer).compute_output_shape is not keras.layers.Layer.compute_output_shape and not call_kwargs:
        shapes = keras.tree.map_structure(lambda leaf: tuple(leaf.shape), _symbolic(inputs))
        computed = (
            layer.compute_output_shape(*shapes) if isinstance(inputs, tuple) else layer.compute_output_shape(shapes)
        )
        computed = [computed] if isinstance(computed[0], (int, type(None))) else list(computed)
        for index, (shape, value) in enumerate(zip(computed, eager_leaves)):
            assert tuple(shape)[1:] == tuple(value.shape)[1:], (
                f"compute_output_shape[{index}]: {shape} vs {value.shape}"
            )

    if expected_num_trainable_weights is not None:
        assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    assert_mixed_precision_close(lambda: layer_class(**init_kwargs), inputs, tolerances=mixed_precision_tolerances)
    assert_jit_matches_eager(layer, inputs, training=False, **call_kwargs)

    model = _functional_model(layer_class, init_kwargs, inputs, call_kwargs)
    model_inputs = keras.tree.flatten(inputs)
    model_inputs = model_inputs if len(model_inputs) > 1 else model_inputs[0]
    if run_training:
        targets = [np.random.default_rng(0).standard_normal(leaf.shape) for leaf in eager_leaves]
        assert_fit_one_step(model, model_inputs, targets if len(targets) > 1 else targets[0], unchanged_ok=unchanged_ok)
    assert_serialization_round_trip(model, model_inputs)
    return layer
