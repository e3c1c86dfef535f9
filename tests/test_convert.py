"""`keras_attn.convert`: the oracle is the unconverted Keras model, same weights, same inputs.

`convert` changes a model in place, so each test builds the model twice with the same weights
(`tests.twin_models.twins`) and converts one: outputs within 1e-5, gradients within float32 rounding, the class and
the variable paths kept, `.keras` reloads checked again; every attention layer that cannot be
converted must be named with its reason. The keras.io examples are `models.keras_io_examples`;
KerasHub's models are in `tests/test_convert_keras_hub.py`.
"""

import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_attn
from keras_attn.keras_internals import attention_takes
from keras_attn.layers import conversion
from keras_attn.patterns import Causal
from models import keras_io_examples
from tests.kernel_registry import kernels_taking
from tests.twin_models import max_difference
from tests.twin_models import twins

LENGTH, WIDTH, HEADS = 12, 16, 4
TOLERANCE = 1e-5


def _encoder_block(x, causal, name):
    """A pre-norm Transformer block built from Keras's own layers."""
    h = keras.layers.LayerNormalization(name=f"{name}_norm")(x)
    h = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"{name}_attention")(h, h, use_causal_mask=causal)
    x = x + h
    h = keras.layers.Dense(2 * WIDTH, activation="gelu", name=f"{name}_up")(keras.layers.LayerNormalization()(x))
    return x + keras.layers.Dense(WIDTH, name=f"{name}_down")(h)


def _token_model(causal=True, blocks=2):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, WIDTH, mask_zero=True)(tokens)
    for index in range(blocks):
        x = _encoder_block(x, causal, f"block{index}")
    return keras.Model(tokens, keras.layers.Dense(3)(x))


def _tokens(seed=0):
    """Two sequences, the second padded (token 0) over its last third."""
    tokens = np.random.default_rng(seed).integers(1, 50, (2, LENGTH)).astype("int32")
    tokens[1, 2 * LENGTH // 3 :] = 0
    return tokens


def _attention_classes(model):
    return [type(layer) for layer in _all_layers(model) if isinstance(layer, keras.layers.MultiHeadAttention)]


def _all_layers(layer):
    yield from layer._flatten_layers(include_self=False, recursive=True)


@keras.saving.register_keras_serializable(package="test_convert")
class CachedAttentionDouble(keras.layers.MultiHeadAttention):
    """A test double of KerasHub's `CachedMultiHeadAttention`, written from its described behaviour.

    Its own `call(query, value, key=None, attention_mask=None, cache=None, cache_update_index=None,
    training=None)` projects the inputs, writes new keys/values into a `(batch, 2, max_len, heads,
    key_dim)` cache at `cache_update_index`, and calls `self._compute_attention`; it returns the
    output, and the cache when one is given.
    """

    def call(self, query, value, key=None, attention_mask=None, cache=None, cache_update_index=None, training=None):
        key = value if key is None else key
        query = self._query_dense(query)
        if cache is not None:
            key_cache, value_cache = cache[:, 0], cache[:, 1]
            if cache_update_index is not None:
                start = (0, cache_update_index, 0, 0)
                key_cache = ops.slice_update(key_cache, start, self._key_dense(key))
                value_cache = ops.slice_update(value_cache, start, self._value_dense(value))
                cache = ops.stack((key_cache, value_cache), axis=1)
            key, value = key_cache, value_cache
        else:
            key, value = self._key_dense(key), self._value_dense(value)
        output, _ = self._compute_attention(
            query=query, key=key, value=value, attention_mask=attention_mask, training=training
        )
        output = self._output_dense(output)
        return output if cache is None else (output, cache)


class OwnSoftmaxAttention(keras.layers.MultiHeadAttention):
    """Overrides part of the attention computation: cannot be converted without losing it."""

    def _masked_softmax(self, attention_scores, attention_mask=None):
        return super()._masked_softmax(attention_scores * 0.5, attention_mask)


class OwnKernelAttention(keras.layers.MultiHeadAttention):
    """Overrides `call` and computes attention in it, never through `_compute_attention`."""

    def call(self, query, value, key=None):
        key = value if key is None else key
        q, k, v = self._query_dense(query), self._key_dense(key), self._value_dense(value)
        weights = ops.softmax(ops.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(self._key_dim), axis=-1)
        return self._output_dense(ops.einsum("bhqk,bkhd->bqhd", weights, v))


@keras.saving.register_keras_serializable(package="test_convert")
class BlockLayer(keras.layers.Layer):
    """A custom layer that builds its own attention layer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)

    def call(self, x):
        return x + self.attention(x, x)


@pytest.mark.parametrize("implementation", ["auto", *kernels_taking(pattern=Causal())])
def test_functional_model_outputs_equal_the_original(implementation):
    model, converted = twins(lambda: _token_model(causal=True))
    attention_layers = [layer for layer in _all_layers(converted) if isinstance(layer, keras.layers.MultiHeadAttention)]
    variables, paths = [id(v) for v in converted.weights], [v.path for v in converted.weights]
    fast, report = keras_attn.convert(converted, implementation=implementation, return_report=True)

    assert fast is converted and type(fast) is type(model)
    assert [id(v) for v in fast.weights] == variables  # the same variables, not copies
    assert [layer for layer in _all_layers(fast) if isinstance(layer, keras.layers.MultiHeadAttention)] == (
        attention_layers
    )
    assert _attention_classes(fast) == [keras_attn.MultiHeadAttention] * 2
    assert {
        layer.implementation for layer in _all_layers(fast) if isinstance(layer, keras_attn.MultiHeadAttention)
    } == {implementation}
    assert report.converted == (f"{fast.name}/block0_attention", f"{fast.name}/block1_attention")
    assert report.unconverted == ()
    tokens = _tokens()
    expected, got = model(tokens, training=False), fast(tokens, training=False)
    # Every position that is a token (padded queries attend nowhere: Keras gives them the mean of
    # the values, ours zero; nothing else reads them, their keys are masked).
    valid = tokens != 0
    assert max_difference(ops.convert_to_numpy(got)[valid], ops.convert_to_numpy(expected)[valid]) < TOLERANCE
    assert [w.path for w in fast.weights] == paths


def test_compiled_with_xla_equals_the_original():
    import tensorflow as tf

    model, fast = twins(lambda: _token_model(causal=True))
    keras_attn.convert(fast)
    tokens = _tokens(10)
    valid = tokens != 0
    got = tf.function(lambda t: fast(t, training=False), jit_compile=True)(tokens)
    expected = model(tokens, training=False)
    assert max_difference(ops.convert_to_numpy(got)[valid], ops.convert_to_numpy(expected)[valid]) < TOLERANCE


def test_masks_and_cross_attention_inputs_equal_the_original():
    def build():
        query = keras.Input((6, WIDTH))
        memory = keras.Input((LENGTH, 8))
        mask = keras.Input((6, LENGTH), dtype="bool")
        gate = dict(use_gate=True) if attention_takes("use_gate") else {}  # Keras 3.15 on
        attention = keras.layers.MultiHeadAttention(2, 5, value_dim=3, output_shape=7, dropout=0.3, **gate)
        output, scores = attention(query, memory, attention_mask=mask, return_attention_scores=True)
        return keras.Model([query, memory, mask], [output, scores])

    model, fast = twins(build)
    keras_attn.convert(fast, implementation="dense")

    rng = np.random.default_rng(1)
    inputs = [rng.normal(size=(2, 6, WIDTH)), rng.normal(size=(2, LENGTH, 8)), rng.random((2, 6, LENGTH)) < 0.7]
    inputs[2][..., 0] = True  # no query without a key
    for expected, got in zip(model(inputs, training=False), fast(inputs, training=False)):
        assert max_difference(got, expected) < TOLERANCE


def test_attention_over_an_image_axes_is_converted_and_runs_our_kernel(monkeypatch):
    # `attention_axes=(1, 2)`: reported converted only because the flattened axes run on our kernel.
    from keras_attn.layers import multi_head_attention

    def build():
        image = keras.Input((3, 4, WIDTH))
        attended = keras.layers.MultiHeadAttention(2, 4, attention_axes=(1, 2), name="spatial")(image, image)
        return keras.Model(image, keras.layers.Dense(2)(attended), name="image_model")

    model, fast = twins(build)
    report = keras_attn.convert(fast, return_report=True)[1]
    assert report.converted == ("image_model/spatial",) and report.unconverted == ()
    kernel_calls = []
    original = multi_head_attention.scaled_dot_product_attention
    monkeypatch.setattr(
        multi_head_attention,
        "scaled_dot_product_attention",
        lambda *args, **kwargs: kernel_calls.append(kwargs) or original(*args, **kwargs),
    )
    x = np.random.default_rng(3).normal(size=(2, 3, 4, WIDTH)).astype("float32")
    assert max_difference(fast(x), model(x)) < TOLERANCE
    assert len(kernel_calls) == 1


def test_sequential_model_with_a_nested_functional_block():
    def build():
        inputs = keras.Input((LENGTH, WIDTH))
        block = keras.Model(inputs, _encoder_block(inputs, causal=False, name="inner"), name="block")
        return keras.Sequential([keras.Input((LENGTH, WIDTH)), block, keras.layers.Dense(2)], name="sequential")

    model, fast = twins(build)
    fast, report = keras_attn.convert(fast, return_report=True)

    assert report.converted == ("sequential/block/inner_attention",)
    assert _attention_classes(fast) == [keras_attn.MultiHeadAttention]
    x = np.random.default_rng(2).normal(size=(3, LENGTH, WIDTH)).astype("float32")
    assert max_difference(fast(x), model(x)) < TOLERANCE


def test_a_shared_layer_is_converted_once_and_stays_shared():
    def build():
        a, b = keras.Input((LENGTH, WIDTH)), keras.Input((LENGTH, WIDTH))
        shared = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="shared")
        return keras.Model([a, b], shared(a, b) + shared(b, a, use_causal_mask=True), name="twice")

    model, fast = twins(build)
    fast, report = keras_attn.convert(fast, return_report=True)

    assert report.converted == ("twice/shared",)
    assert _attention_classes(fast) == [keras_attn.MultiHeadAttention]
    assert len(fast.weights) == len(model.weights)
    rng = np.random.default_rng(12)
    x = [rng.normal(size=(2, LENGTH, WIDTH)).astype("float32") for _ in range(2)]
    assert max_difference(fast(x), model(x)) < TOLERANCE


def test_keras_file_round_trip_of_the_converted_model(tmp_path):
    model = _token_model(causal=False)
    fast = keras_attn.convert(model, implementation="blockwise")
    path = tmp_path / "fast.keras"
    fast.save(path)
    reloaded = keras.saving.load_model(path)

    assert _attention_classes(reloaded) == [keras_attn.MultiHeadAttention] * 2
    assert {
        layer.implementation for layer in _all_layers(reloaded) if isinstance(layer, keras_attn.MultiHeadAttention)
    } == {"blockwise"}
    tokens = _tokens(3)
    assert max_difference(reloaded(tokens), fast(tokens)) == 0.0


@keras.saving.register_keras_serializable(package="test_convert")
class ScaledQueryAttention(keras.layers.MultiHeadAttention):
    """A subclass with its own config argument whose `call` wraps Keras's through `super().call`."""

    def __init__(self, *args, query_scale=2.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.query_scale = query_scale

    def call(self, query, value, key=None, **kwargs):
        return super().call(query * self.query_scale, value, key=key, **kwargs)

    def get_config(self):
        return {**super().get_config(), "query_scale": self.query_scale}


def test_a_subclass_calling_super_call_and_layers_already_ours(tmp_path):
    def build():
        inputs = keras.Input((LENGTH, WIDTH))
        x = ScaledQueryAttention(HEADS, WIDTH // HEADS, query_scale=0.5, name="scaled")(
            inputs, inputs, use_causal_mask=True
        )
        x = keras_attn.MultiHeadAttention(HEADS, WIDTH // HEADS, implementation="blockwise", name="ours")(x, x)
        return keras.Model(inputs, x, name="model")

    model, fast = twins(build)
    fast, report = keras_attn.convert(fast, implementation="dense", return_report=True)

    assert report.converted == ("model/scaled",) and report.already_ours == ("model/ours",)
    assert "already keras_attn's: model/ours" in str(report)
    scaled, ours = fast.get_layer("scaled"), fast.get_layer("ours")
    assert isinstance(scaled, ScaledQueryAttention) and isinstance(scaled, keras_attn.MultiHeadAttention)
    assert (scaled.query_scale, scaled.implementation) == (0.5, "dense")
    assert type(ours) is keras_attn.MultiHeadAttention and ours.implementation == "blockwise"  # its own choice kept
    x = np.random.default_rng(9).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    assert max_difference(fast(x), model(x)) < TOLERANCE
    fast.save(tmp_path / "scaled.keras")
    reloaded = keras.saving.load_model(tmp_path / "scaled.keras")
    assert reloaded.get_layer("scaled").query_scale == 0.5
    assert max_difference(reloaded(x), fast(x)) == 0.0


def _cached_model():
    inputs = keras.Input((LENGTH, WIDTH))
    mask = keras.Input((LENGTH, LENGTH), dtype="bool")
    x = CachedAttentionDouble(HEADS, WIDTH // HEADS, name="cached")(inputs, inputs, attention_mask=mask)
    return keras.Model([inputs, mask], keras.layers.Dense(2)(x))


def test_a_subclass_keeps_its_call_and_runs_our_attention(tmp_path, monkeypatch):
    model, fast = twins(_cached_model)
    fast, report = keras_attn.convert(fast, implementation="blockwise", return_report=True)
    (layer,) = [layer for layer in fast.layers if isinstance(layer, keras.layers.MultiHeadAttention)]
    assert isinstance(layer, CachedAttentionDouble) and isinstance(layer, keras_attn.MultiHeadAttention)
    assert type(layer).call is CachedAttentionDouble.call
    assert type(layer)._compute_attention is keras_attn.MultiHeadAttention._compute_attention
    assert layer.implementation == "blockwise"
    assert report.converted == (f"{fast.name}/cached",)

    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, LENGTH, WIDTH)).astype("float32")
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))[None].repeat(2, axis=0)
    assert max_difference(fast([x, causal]), model([x, causal])) < TOLERANCE

    # The subclass's own cache path: decode the last token into a cache holding the others.
    original = model.get_layer("cached")
    cache = np.zeros((2, 2, LENGTH, HEADS, WIDTH // HEADS), "float32")
    _, cache = original(x[:, :-1], x[:, :-1], attention_mask=causal[:, :-1, :], cache=cache, cache_update_index=0)
    step = dict(attention_mask=causal[:, -1:, :], cache=cache, cache_update_index=LENGTH - 1)
    expected, expected_cache = original(x[:, -1:], x[:, -1:], **step)
    got, got_cache = layer(x[:, -1:], x[:, -1:], **step)
    assert max_difference(got, expected) < TOLERANCE
    assert max_difference(got_cache, expected_cache) < TOLERANCE

    # .keras round trip; the converted class is rebuilt as a fresh process would (none cached).
    path = tmp_path / "cached.keras"
    fast.save(path)
    monkeypatch.setattr(conversion, "_CONVERTED_CLASSES", {})
    reloaded = keras.saving.load_model(path)
    reloaded_layer = reloaded.get_layer("cached")
    assert isinstance(reloaded_layer, CachedAttentionDouble) and isinstance(
        reloaded_layer, keras_attn.MultiHeadAttention
    )
    assert reloaded_layer.implementation == "blockwise"
    assert max_difference(reloaded([x, causal]), fast([x, causal])) == 0.0
    assert reloaded_layer.get_config()[conversion._CONVERTED_FROM] == "test_convert>CachedAttentionDouble"


_RELOAD_IN_A_FRESH_PROCESS = """
import sys
import keras
import numpy as np
import tests.test_convert  # registers the subclass double, as importing KerasHub would
from keras_attn.layers.multi_head_attention import MultiHeadAttention
for name in sys.argv[1:]:
    model = keras.saving.load_model(name + ".keras")
    kinds = [isinstance(l, MultiHeadAttention) for l in model._flatten_layers() if isinstance(l, keras.layers.MultiHeadAttention)]
    assert kinds and all(kinds), (name, kinds)
    inputs = np.load(name + ".npz")
    np.save(name + ".reloaded.npy", keras.ops.convert_to_numpy(model([inputs[k] for k in sorted(inputs)])))
"""


def test_converted_models_reload_in_a_fresh_process(tmp_path):
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, LENGTH, WIDTH)).astype("float32")
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))[None].repeat(2, axis=0)
    inputs = keras.Input((LENGTH, WIDTH))
    plain = keras.Model([inputs], _encoder_block(inputs, causal=True, name="plain"))
    cases = {"plain": (plain, {"a": x}), "cached": (_cached_model(), {"a": x, "b": causal})}
    expected = {}
    for name, (model, arrays) in cases.items():
        fast = keras_attn.convert(model)
        fast.save(tmp_path / f"{name}.keras")
        np.savez(tmp_path / f"{name}.npz", **arrays)
        expected[name] = ops.convert_to_numpy(fast([arrays[k] for k in sorted(arrays)]))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", _RELOAD_IN_A_FRESH_PROCESS, *(str(tmp_path / name) for name in cases)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in cases:
        assert max_difference(np.load(tmp_path / f"{name}.reloaded.npy"), expected[name]) == 0.0


def test_gradients_equal_the_original_and_a_training_step_runs():
    model, fast = twins(lambda: _token_model(causal=True))
    keras_attn.convert(fast)
    tokens = _tokens(5)
    labels = np.random.default_rng(5).integers(0, 3, tokens.shape)

    def gradients(m):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(labels, m(tokens, training=True), from_logits=True)
            loss = tf.reduce_sum(tf.where(tokens != 0, loss, 0.0))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, m.trainable_variables)]  # embedding: IndexedSlices

    for expected, got in zip(gradients(model), gradients(fast)):
        assert max_difference(got, expected) < 1e-4 * max(1.0, float(np.max(np.abs(expected))))
    fast.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.numpy().copy() for w in fast.trainable_weights]
    history = fast.fit(tokens, labels, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(max_difference(a, b.numpy()) > 0 for a, b in zip(before, fast.trainable_weights))


def test_mixed_precision_policy_is_kept():
    def build():
        inputs = keras.Input((LENGTH, WIDTH))
        return keras.Model(
            inputs, keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, dtype="mixed_float16")(inputs, inputs)
        )

    model, fast = twins(build)
    keras_attn.convert(fast)
    layer = fast.layers[1]
    assert isinstance(layer, keras_attn.MultiHeadAttention)
    assert layer.dtype_policy.name == "mixed_float16" and layer.compute_dtype == "float16"
    x = np.random.default_rng(6).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    assert max_difference(fast(x), model(x)) < 1e-2  # float16 rounding


def _unconvertible_model():
    inputs = keras.Input((LENGTH, WIDTH))
    x = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="plain")(inputs, inputs)
    x = OwnSoftmaxAttention(HEADS, WIDTH // HEADS, name="own_softmax")(x, x)
    x = OwnKernelAttention(HEADS, WIDTH // HEADS, name="own_kernel")(x, x)
    x = BlockLayer(name="block")(x)
    return keras.Model(inputs, x, name="mixed")


def test_layers_it_cannot_replace_are_named_with_the_reason():
    model, fast = twins(_unconvertible_model)
    with pytest.raises(ValueError) as raised:
        keras_attn.convert(fast)
    message = str(raised.value)
    assert "the model `mixed` (Functional)" in message
    assert "mixed/own_softmax: its class OwnSoftmaxAttention overrides `_masked_softmax`" in message
    assert "mixed/own_kernel: its class OwnKernelAttention overrides `call` and computes attention without" in message
    assert "mixed/plain" not in message and "mixed/block" not in message
    assert _attention_classes(fast) == _attention_classes(model)  # strict: nothing changed

    with pytest.warns(UserWarning, match="kept 2 attention layer"):
        fast, report = keras_attn.convert(fast, strict=False, return_report=True)
    assert report.converted[0] == "mixed/plain"
    assert re.fullmatch(r"mixed/block/multi_head_attention\w*", report.converted[1])  # inside the custom layer
    assert [path for path, _ in report.unconverted] == ["mixed/own_softmax", "mixed/own_kernel"]
    assert "not converted: mixed/own_kernel" in str(report)
    assert [type(layer).__name__ for layer in fast.layers[1:]] == [
        "MultiHeadAttention",
        "OwnSoftmaxAttention",
        "OwnKernelAttention",
        "BlockLayer",
    ]
    assert isinstance(fast.layers[1], keras_attn.MultiHeadAttention)
    assert type(fast.get_layer("block").attention) is keras_attn.MultiHeadAttention
    x = np.random.default_rng(7).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    assert max_difference(fast(x), model(x)) < TOLERANCE


def test_a_model_without_attention_to_convert_is_refused_or_warned():
    inputs = keras.Input((LENGTH, WIDTH))
    dense = keras.Model(inputs, keras.layers.Dense(2)(inputs), name="dense_only")
    with pytest.raises(ValueError, match=r"no attention layer it can convert in the model `dense_only` "):
        keras_attn.convert(dense)
    with pytest.warns(UserWarning, match=r"the model is unchanged. Found: no attention layer"):
        assert keras_attn.convert(dense, strict=False) is dense

    only_unconvertible = keras.Model(inputs, OwnSoftmaxAttention(HEADS, 4, name="own")(inputs, inputs), name="own")
    with pytest.warns(UserWarning, match=r"the model is unchanged. Found:\n  own/own: its class OwnSoftmaxAttention"):
        keras_attn.convert(only_unconvertible, strict=False)


@pytest.mark.parametrize("convert_first", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_quantized_models_convert_before_or_after_quantize(convert_first):
    def build():
        inputs = keras.Input((LENGTH, WIDTH))
        return keras.Model(inputs, keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(inputs, inputs))

    x = np.random.default_rng(11).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    model, fast = twins(build)
    model.quantize("int8")
    if convert_first:
        keras_attn.convert(fast)
        fast.quantize("int8")
    else:
        fast.quantize("int8")
        keras_attn.convert(fast)
    layer = fast.layers[1]
    assert isinstance(layer, keras_attn.MultiHeadAttention) and layer._query_dense.quantization_mode == "int8"
    assert max_difference(fast(x), model(x)) < 1e-4


class Subclassed(keras.Model):
    """A subclassed model holding Keras's attention layer, built by its first call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return self.head(self.attention(x, x, use_causal_mask=True))


@pytest.mark.parametrize("built", [True, False])
def test_a_subclassed_model_built_or_not(built):
    x = np.random.default_rng(13).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    model, fast = Subclassed(name="sub"), Subclassed(name="sub")
    model(x)
    if built:
        fast(x)
        fast.set_weights(model.get_weights())
    fast, report = keras_attn.convert(fast, return_report=True)
    assert re.fullmatch(r"sub/multi_head_attention\w*", report.converted[0]) and len(report.converted) == 1
    assert type(fast) is Subclassed and type(fast.attention) is keras_attn.MultiHeadAttention
    if not built:  # built by Keras's own `build`, as the layer was Keras's when it was made
        fast(x)
        fast.set_weights(model.get_weights())
    assert max_difference(fast(x), model(x)) < TOLERANCE
    assert fast.attention._sequence_attention  # our kernels' path, not Keras's einsum


def test_functions_traced_before_convert_are_traced_again():
    model, fast = twins(lambda: _token_model(causal=True))
    fast.compile(loss="mse")
    tokens = _tokens(14)
    before = fast.predict(tokens, verbose=0)
    keras_attn.convert(fast)
    assert fast.predict_function is None  # the next predict traces our layers
    calls = []
    original = conversion.MultiHeadAttention._attend
    try:
        conversion.MultiHeadAttention._attend = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
        after = fast.predict(tokens, verbose=0)
    finally:
        conversion.MultiHeadAttention._attend = original
    assert calls
    valid = tokens != 0
    assert max_difference(after[valid], before[valid]) < TOLERANCE


def test_keras_io_text_classification_example():
    model, fast = twins(lambda: keras_io_examples.text_classifier(LENGTH, 50, WIDTH, HEADS, 2 * WIDTH))
    fast, report = keras_attn.convert(fast, return_report=True)
    assert type(fast) is type(model) and len(report.converted) == 1 and report.unconverted == ()
    assert re.fullmatch(rf"{fast.name}/transformer_block\w*/multi_head_attention\w*", report.converted[0])
    tokens = _tokens(15)
    labels = np.array([0, 1])
    assert max_difference(fast(tokens), model(tokens)) < TOLERANCE
    _check_gradients_and_fit(model, fast, tokens, labels, keras.losses.SparseCategoricalCrossentropy())


def test_keras_io_translation_example():
    model, fast = twins(lambda: keras_io_examples.english_to_spanish_translator(LENGTH, 50, WIDTH, 2 * WIDTH, HEADS))
    fast, report = keras_attn.convert(fast, return_report=True)
    assert type(fast) is type(model) and report.unconverted == ()
    assert [path.split("/")[:2] for path in report.converted] == [["transformer", "encoder"]] + [
        ["transformer", "decoder"]
    ] * 2
    inputs = [_tokens(16), _tokens(17)]
    valid = inputs[1] != 0  # padded decoder queries: Keras averages the values, ours gives zeros
    expected, got = ops.convert_to_numpy(model(inputs)), ops.convert_to_numpy(fast(inputs))
    assert max_difference(got[valid], expected[valid]) < TOLERANCE
    labels = np.random.default_rng(17).integers(0, 50, inputs[1].shape)
    _check_gradients_and_fit(model, fast, inputs, labels, keras.losses.SparseCategoricalCrossentropy(), valid)


@pytest.mark.parametrize(
    "build",
    [
        lambda: keras_io_examples.timeseries_transformer((LENGTH, 1), 4, 2, 4, 2, (8,)),  # attention dropout 0.25
        lambda: keras_io_examples.vision_transformer(12, 6, 8, 2, 1, (8,), 3),  # attention dropout 0.1
    ],
    ids=["timeseries", "vit"],
)
def test_keras_io_examples_with_attention_dropout_are_converted(build, monkeypatch):
    """Keras's layer with `dropout>0` keeps its own path under `enable()`; `convert` replaces it, and
    training runs our kernel with the layer's dropout."""
    model, fast = twins(build)
    fast, report = keras_attn.convert(fast, return_report=True)
    layers = [layer for layer in fast._flatten_layers() if isinstance(layer, keras.layers.MultiHeadAttention)]
    assert report.unconverted == () and len(report.converted) == len(layers) > 0
    assert all(type(layer) is keras_attn.MultiHeadAttention and layer.dropout > 0 for layer in layers)
    x = np.random.default_rng(18).normal(size=(2, *model.input_shape[1:])).astype("float32")
    assert max_difference(fast(x, training=False), model(x, training=False)) < TOLERANCE
    rates = []
    original = conversion.MultiHeadAttention._attend
    monkeypatch.setattr(
        conversion.MultiHeadAttention,
        "_attend",
        lambda self, *args, **kwargs: rates.append((self.dropout, args[3])) or original(self, *args, **kwargs),
    )
    assert np.all(np.isfinite(ops.convert_to_numpy(fast(x, training=True))))
    assert rates and all(rate > 0 and training for rate, training in rates)


def _check_gradients_and_fit(model, fast, inputs, labels, loss, valid=None):
    """Gradients of `fast` within 1e-5 of `model`'s, relative to the largest (tens, summed over the
    batch: float32's rounding), with the loss over the `valid` positions; then one `fit` step."""
    import tensorflow as tf

    def gradients(m):
        with tf.GradientTape() as tape:
            losses = loss.call(labels, m(inputs, training=False))
            total = tf.reduce_sum(losses if valid is None else tf.where(valid, losses, 0.0))
        return [tf.convert_to_tensor(g) for g in tape.gradient(total, m.trainable_variables)]

    for expected, got in zip(gradients(model), gradients(fast)):
        assert max_difference(got, expected) < TOLERANCE * max(1.0, float(np.max(np.abs(expected))))
    fast.compile(optimizer="adam", loss=loss)
    history = fast.fit(inputs, labels, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_import_keras_attn_does_not_import_keras_hub():
    import subprocess
    import sys

    code = "import sys, keras_attn; print('keras_hub' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "arguments, match",
    [
        (dict(implementation="flash"), r"`implementation` must be one of .* Received: implementation='flash'"),
        (dict(implementation=True), r"Received: implementation=True"),
        (dict(strict="no"), r"`strict` must be True or False. Received: strict='no'"),
        (dict(return_report=1), r"`return_report` must be True or False. Received: return_report=1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(arguments, match):
    with pytest.raises(ValueError, match=match):
        keras_attn.convert(_token_model(blocks=1), **arguments)


def test_a_layer_is_not_a_model():
    layer = keras.layers.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=r"`model` must be a keras.Model. Received: model=<MultiHeadAttention"):
        keras_attn.convert(layer)


def test_a_custom_layers_attention_reloads_as_its_code_builds_it_and_converts_again(tmp_path):
    """The guides' saving rule: a Functional model's own attention layers reload converted, the one
    a custom layer builds in its code reloads as Keras's layer, with the same outputs either way."""
    inputs = keras.Input((LENGTH, WIDTH))
    x = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="plain")(inputs, inputs)
    model = keras_attn.convert(keras.Model(inputs, BlockLayer(name="block")(x)))
    x = np.random.default_rng(5).normal(size=(2, LENGTH, WIDTH)).astype("float32")
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(loaded.get_layer("plain"), keras_attn.MultiHeadAttention)
    assert type(loaded.get_layer("block").attention) is keras.layers.MultiHeadAttention
    assert max_difference(loaded(x), model(x)) < TOLERANCE
    keras_attn.convert(loaded)
    assert isinstance(loaded.get_layer("block").attention, keras_attn.MultiHeadAttention)
