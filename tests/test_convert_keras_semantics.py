"""`keras_attn.convert` keeps what Keras's layer computes for a query with no allowed key.

Keras's `MultiHeadAttention` gives such a row (a padded query of `Embedding(mask_zero=True)`) the
output projection of the mean of the values; a plain `x + y` drops the Keras mask, so the next
layer reads those rows. The oracle is the Keras model itself, built twice with the same weights.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from tests.test_convert import CachedAttentionDouble
from tests.twin_models import max_difference
from tests.twin_models import twins

LENGTH, WIDTH, HEADS, VOCABULARY = 6, 8, 2, 20
TOLERANCE = 1e-5


def _model(causal, dropout=0.0):
    """Two attention blocks whose Keras mask a plain `x + y` drops, pooled over every position."""
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, WIDTH, mask_zero=True)(tokens)
    for _ in range(2):
        x = x + keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, dropout=dropout)(x, x, use_causal_mask=causal)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(3)(x))


def _tokens(padding):
    """Two rows, the first padded (token 0) on the `padding` side over half its length."""
    tokens = np.random.default_rng(0).integers(1, VOCABULARY, (2, LENGTH)).astype("int32")
    if padding == "left":
        tokens[0, : LENGTH // 2] = 0
    else:
        tokens[0, LENGTH // 2 :] = 0
    return tokens


def _outputs_and_gradients(model, tokens):
    with tf.GradientTape() as tape:
        outputs = model(tokens)
        loss = tf.reduce_sum(outputs * tf.range(1.0, 4.0))
    gradients = tape.gradient(loss, model.trainable_variables)
    return outputs, [tf.convert_to_tensor(gradient) for gradient in gradients]


def _check_same(reference, model, tokens):
    expected, expected_gradients = _outputs_and_gradients(reference, tokens)
    outputs, gradients = _outputs_and_gradients(model, tokens)
    assert max_difference(outputs, expected) < TOLERANCE
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        assert max_difference(gradient, expected_gradient) < TOLERANCE * max(
            1.0, float(np.abs(expected_gradient).max())
        )


@pytest.mark.parametrize("implementation", ["auto", "blockwise"])
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("causal", [False, True])
def test_converted_model_with_a_dropped_mask_equals_keras_outputs_and_gradients(causal, padding, implementation):
    reference, model = twins(lambda: _model(causal))
    keras_attn.convert(model, implementation=implementation)
    _check_same(reference, model, _tokens(padding))


def test_the_fix_matters_our_own_layer_keeps_its_zero():
    """Keras-attn's layers keep exact zeros for a padded query (what the Keras rows differ from)."""
    reference, model = twins(lambda: _model(False))
    keras_attn.convert(model)
    tokens = _tokens("right")
    layer = next(layer for layer in model.layers if isinstance(layer, keras_attn.MultiHeadAttention))
    assert layer.rows_without_keys == "keras"
    embedded = model.layers[1](tokens)
    mask = tokens != 0
    own = keras_attn.MultiHeadAttention(HEADS, WIDTH // HEADS)
    own(embedded, embedded)
    own.set_weights(layer.get_weights())
    assert own.rows_without_keys == "zero"
    assert max_difference(own(embedded, embedded, query_mask=mask, value_mask=mask)[0, LENGTH // 2 :], 0.0) == 0.0
    keras_rows = layer(embedded, embedded, query_mask=mask, value_mask=mask)[0, LENGTH // 2 :]
    assert max_difference(keras_rows, 0.0) > 1e-3  # Keras's rows are not zero


def test_with_dropout_keras_takes_its_einsum_path_and_the_converted_layer_follows():
    """With dropout Keras's softmax zeroes a fully masked row; the output projection's bias remains."""
    reference, model = twins(lambda: _model(False, dropout=0.5))
    for layer in reference.layers:
        if isinstance(layer, keras.layers.MultiHeadAttention):
            layer._output_dense.bias.assign(np.full(WIDTH, 0.3, "float32"))
    model.set_weights(reference.get_weights())
    keras_attn.convert(model)
    _check_same(reference, model, _tokens("right"))


def test_a_reloaded_converted_model_keeps_keras_semantics(tmp_path):
    reference, model = twins(lambda: _model(True))
    keras_attn.convert(model)
    path = tmp_path / "converted.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    layers = [layer for layer in reloaded.layers if isinstance(layer, keras_attn.MultiHeadAttention)]
    assert [layer.rows_without_keys for layer in layers] == ["keras", "keras"]
    _check_same(reference, reloaded, _tokens("left"))


def test_a_converted_subclass_hook_gives_keras_rows():
    """A subclass's own `call` (KerasHub's cache) reaches the rows through `_compute_attention`."""
    x = keras.random.normal((2, LENGTH, WIDTH), seed=1)
    mask = np.ones((2, LENGTH, LENGTH), bool)
    mask[0, 2] = False  # query 2 of row 0 has no allowed key

    def build():
        layer = CachedAttentionDouble(HEADS, WIDTH // HEADS)
        layer(x, x)
        return layer

    reference = build()
    layer = build()
    layer.set_weights(reference.get_weights())
    keras_attn.convert(_Holder(layer))
    assert isinstance(layer, keras_attn.MultiHeadAttention)
    assert max_difference(layer(x, x, attention_mask=mask), reference(x, x, attention_mask=mask)) < TOLERANCE


class _Holder(keras.Model):
    def __init__(self, layer):
        super().__init__()
        self.attention = layer

    def call(self, x):
        return self.attention(x, x)


def test_bad_rows_without_keys_is_refused_naming_it():
    with pytest.raises(ValueError, match="rows_without_keys.*Received: rows_without_keys='mean'"):
        keras_attn.MultiHeadAttention(2, 4, rows_without_keys="mean")
