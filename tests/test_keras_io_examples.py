"""The keras.io examples of `models.keras_io_examples` behave as published: the translator's decoder
is causal, and both models reload from `.keras` with the same outputs."""

import keras
import numpy as np
import pytest

from models import keras_io_examples


def _translator():
    keras.utils.set_random_seed(0)
    return keras_io_examples.english_to_spanish_translator(
        sequence_length=12, vocab_size=50, embed_dim=16, latent_dim=32, num_heads=2
    )


def _translator_inputs(rng, length=9):
    return [rng.integers(1, 50, (2, length)).astype("int64") for _ in range(2)]


def test_translator_decoder_is_causal():
    model, inputs = _translator(), _translator_inputs(np.random.default_rng(1))
    changed = [inputs[0], inputs[1].copy()]
    changed[1][:, 6:] = 3
    before, after = np.asarray(model(inputs)), np.asarray(model(changed))
    np.testing.assert_allclose(after[:, :6], before[:, :6], atol=1e-6)
    assert not np.allclose(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize("name", ["text_classifier", "translator"])
def test_examples_reload_from_keras_files_with_the_same_outputs(name, tmp_path):
    rng = np.random.default_rng(2)
    if name == "translator":
        model, inputs = _translator(), _translator_inputs(rng)
    else:
        model = keras_io_examples.text_classifier(maxlen=10, vocab_size=50, embed_dim=8, num_heads=2, ff_dim=8)
        inputs = rng.integers(0, 50, (3, 10))
    path = tmp_path / f"{name}.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_allclose(np.asarray(reloaded(inputs)), np.asarray(model(inputs)), atol=1e-6)
