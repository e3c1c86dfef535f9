"""`attention_weights` / `AttentionMap`: the collected maps are the layers' own returned weights."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.visualization import AttentionCapture
from keras_attn.visualization import attention_maps
from keras_attn.visualization import attention_weights
from keras_attn.visualization import focus
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_sentiment_classifier
from models.translator import TranslatorConfig
from models.translator import build_translator
from tests import reference
from tests.layer_checks import padded_token_ids


def assert_attention_rows(weights, query_real, key_real):
    """Real query rows sum to 1 over real keys; masked keys and padded query rows are exactly 0."""
    real = query_real[:, None, :, None] & key_real[:, None, None, :]  # (batch, 1, query_len, key_len)
    np.testing.assert_array_equal(weights[np.broadcast_to(~real, weights.shape)], 0.0)
    sums = weights.sum(axis=-1)  # (batch, heads, query_len)
    np.testing.assert_allclose(sums[np.broadcast_to(query_real[:, None, :], sums.shape)], 1.0, atol=1e-5)


def test_single_layer_matches_numpy_reference_and_leaves_outputs_unchanged():
    inputs = keras.Input((None, 8))
    mask = keras.Input((None,), dtype="bool")
    layer = keras_attn.SelfAttention(num_heads=2, key_dim=4, name="attend")
    model = keras.Model([inputs, mask], layer(inputs, query_mask=mask, value_mask=mask))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8)).astype("float32")
    padding = np.arange(5)[None] < np.array([[5], [3]])  # (batch, seq)
    expected_output = keras.ops.convert_to_numpy(model([x, padding]))

    collected = attention_weights(model, [x, padding])

    assert list(collected) == ["attend"]
    weights = collected["attend"]
    assert weights.shape == (2, 2, 5, 5)
    _, expected = reference.multi_head_attention(
        [np.asarray(w, np.float64) for w in layer.get_weights()],
        x.astype(np.float64),
        x.astype(np.float64),
        mask=reference.padding_attention_mask(padding, padding),
    )
    np.testing.assert_allclose(weights, expected, atol=1e-5)
    assert_attention_rows(weights, padding, padding)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model([x, padding])), expected_output)
    assert "call" not in layer.__dict__  # the layer is itself again after the capture


def test_imdb_encoder_maps_equal_the_encoder_returned_weights():
    config = SentimentClassifierConfig(
        vocabulary_size=50,
        max_tokens=16,
        sequence_length=12,
        embedding_dim=8,
        num_heads=2,
        intermediate_dim=16,
        num_layers=2,
        bigram_buckets=64,
    )
    model = build_sentiment_classifier(config)
    token_ids = padded_token_ids(np.random.default_rng(1), [16, 9, 3], 16, config.vocabulary_size)

    collected = attention_weights(model, token_ids)

    assert list(collected) == ["encoder_0/self_attention", "encoder_1/self_attention"]
    first_tokens = token_ids[:, : config.sequence_length]
    padding = first_tokens != 0
    hidden = keras.Model(model.input, model.get_layer("embedding_dropout").output)(token_ids)
    for index in range(config.num_layers):
        hidden, expected = model.get_layer(f"encoder_{index}")(
            hidden, padding_mask=padding, return_attention_scores=True
        )
        np.testing.assert_array_equal(
            collected[f"encoder_{index}/self_attention"], keras.ops.convert_to_numpy(expected)
        )
        assert_attention_rows(collected[f"encoder_{index}/self_attention"], padding, padding)


def _recorded_calls(layer):
    """Wraps `layer.call` to record its arguments: the oracle re-calls the layer with them."""
    calls = []
    original = layer.call

    def call(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    layer.__dict__["call"] = call
    return calls


def test_translator_cross_attention_maps_equal_the_layers_returned_weights():
    keras.utils.set_random_seed(2)
    model = build_translator(
        TranslatorConfig(
            source_vocabulary_size=40,
            target_vocabulary_size=30,
            sequence_length=10,
            embedding_dim=16,
            intermediate_dim=32,
            num_heads=2,
            num_encoder_layers=1,
            num_decoder_layers=2,
            dropout=0.0,
        )
    )
    rng = np.random.default_rng(3)
    source = padded_token_ids(rng, [9, 4, 1], 9, 40)
    target = padded_token_ids(rng, [7, 7, 2], 7, 30)
    cross_layers = [block.cross_attention for block in model.decoder_layers]
    recorded = [_recorded_calls(layer) for layer in cross_layers]

    collected = attention_weights(model, (source, target))

    for layer in cross_layers:
        layer.__dict__.pop("call")
    assert [name for name in collected if "cross" in name] == [layer.path for layer in cross_layers]
    assert len(collected) == 1 + 2 * 2  # encoder self, decoder self and cross per block
    for layer, calls in zip(cross_layers, recorded):
        ((args, kwargs),) = calls
        kwargs = {key: value for key, value in kwargs.items() if key != "return_attention_scores"}
        _, expected = layer(*args, **kwargs, return_attention_scores=True)
        weights = collected[layer.path]
        assert weights.shape == (3, 2, 7, 9)
        np.testing.assert_array_equal(weights, keras.ops.convert_to_numpy(expected))
        assert_attention_rows(weights, target != 0, source != 0)


def test_shared_layer_is_recorded_once_per_call_and_capture_keeps_asked_scores():
    layer = keras_attn.SelfAttention(num_heads=1, key_dim=2, name="shared")
    x = np.random.default_rng(0).standard_normal((1, 3, 4)).astype("float32")

    class Twice(keras.Model):
        def __init__(self):
            super().__init__()
            self.attend = layer

        def call(self, inputs, training=None):
            output, scores = self.attend(inputs, return_attention_scores=True)
            return self.attend(output) + 0.0 * keras.ops.sum(scores)

    model = Twice()
    collected = attention_weights(model, x)
    assert list(collected) == ["shared", "shared#2"]
    assert collected["shared"].shape == collected["shared#2"].shape == (1, 1, 3, 3)


def test_model_without_attention_layers_is_refused_by_name():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs), name="dense_only")
    with pytest.raises(ValueError, match="no keras_attn attention layer.*dense_only"):
        AttentionCapture(model)


def test_attention_maps_cut_padding_and_focus_keeps_top_keys_in_order():
    weights = np.zeros((1, 2, 6, 6), np.float32)
    weights[0, :, :4, :4] = np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 4))
    (attention_map,) = attention_maps({"layer": weights}, list("abcd"))
    assert attention_map.weights.shape == (2, 4, 4)
    with pytest.raises(ValueError, match="one label per position"):
        type(attention_map)("layer", weights[0], list("abc"), list("abcdef"))

    long = np.random.default_rng(1).dirichlet(np.ones(300), size=(2, 300)).astype(np.float32)
    (long_map,) = attention_maps({"long": long[None]}, [f"t{i}" for i in range(300)])
    shown = focus(long_map, max_queries=20, max_keys=16, query_start=100)
    assert shown.weights.shape == (2, 20, 16)
    assert shown.query_positions == tuple(range(100, 120))
    received = long[:, 100:120].sum(axis=(0, 1))
    assert sorted(shown.key_positions) == list(shown.key_positions)
    assert set(shown.key_positions) == set(np.argsort(-received)[:16])
    np.testing.assert_array_equal(shown.weights, long[:, 100:120][:, :, list(shown.key_positions)])
    assert shown.key_tokens == tuple(f"t{j}" for j in shown.key_positions)
    with pytest.raises(ValueError, match="max_keys"):
        focus(long_map, max_keys=0)


def test_library_and_capture_work_without_matplotlib_and_figures_say_what_to_install():
    # `None` in sys.modules makes `import matplotlib` fail, as if it were not installed.
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import numpy as np, keras_attn\n"
        "from keras_attn import visualization\n"
        "maps = visualization.attention_maps({'a': np.full((1, 1, 2, 2), 0.5, 'float32')}, ['x', 'y'])\n"
        "visualization.explorer_html(maps)\n"
        "try:\n"
        "    visualization.plot_head(maps[0])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert 'pip install "keras-attn[viz]"' in result.stdout


@pytest.mark.parametrize("name", sorted(keras_attn.attention_families.FAMILIES))
def test_a_model_with_each_family_is_captured_with_the_family_scores(name):
    """Every family is found by its declared capabilities and captured; the maps are its own scores."""
    arguments = {"lsh": dict(num_buckets=2, chunk_size=3, seed=1), "linformer": dict(max_length=8, projected_length=3)}
    family = keras_attn.attention_families.build(name, num_heads=2, key_dim=4, **arguments.get(name, {}))
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(tokens)
    encoded = keras_attn.TransformerEncoder(16, 2, self_attention=family, name="encoder")(embedded)
    model = keras.Model(tokens, encoded)
    ids = padded_token_ids(np.random.default_rng(3), [7, 4], 7, 10)
    output = keras.ops.convert_to_numpy(model(ids))

    collected = attention_weights(model, ids)

    assert list(collected) == ["encoder/self_attention"]
    weights = collected["encoder/self_attention"]
    key_len = 3 if name == "linformer" else 7  # Linformer weighs its projected keys
    assert weights.shape == (2, 2, 7, key_len)
    embedded_ids = model.layers[1](ids)
    encoder = model.get_layer("encoder")
    _, expected = encoder(embedded_ids, return_attention_scores=True)
    np.testing.assert_allclose(weights, keras.ops.convert_to_numpy(expected), atol=1e-6)
    real = ids != 0
    sums = weights.sum(-1)
    np.testing.assert_allclose(sums[np.broadcast_to(real[:, None], sums.shape)], 1.0, atol=1e-5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(ids)), output)  # the outputs are unchanged
