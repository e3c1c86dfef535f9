"""Small slices of the real Tatoeba English-Spanish pairs and a tiny trained translator, cached.

The data is read from `../shared/data/spa-eng/spa-eng.zip` (never copied into the repository);
tests that need it are skipped when the file is not there. Everything is built once per process.
"""

import functools
from pathlib import Path

import keras
import numpy as np
import pytest

SPA_ENG_ZIP = Path(__file__).resolve().parents[2] / "shared" / "data" / "spa-eng" / "spa-eng.zip"
TINY_LENGTH = 16


def require_data():
    if not SPA_ENG_ZIP.is_file():
        pytest.skip(f"the shared data set is not at {SPA_ENG_ZIP}")
    return SPA_ENG_ZIP


@functools.lru_cache(maxsize=None)
def spanish_english_slice(count=1_200, seed=7):
    """`count` random (Spanish, English) pairs of at most 10 words, from the whole file."""
    from pipelines.translation_data import orient_pairs
    from pipelines.translation_data import read_pairs

    sources, targets = orient_pairs(read_pairs(require_data()), ("en", "es"), "es", "en")
    short = [i for i, text in enumerate(sources) if len(text.split()) <= 10]
    chosen = np.random.default_rng(seed).choice(short, size=count, replace=False)
    return [sources[i] for i in chosen], [targets[i] for i in chosen]


@functools.lru_cache(maxsize=None)
def tiny_vectorizers():
    from pipelines.translation_data import TranslationVectorizers
    from pipelines.translation_data import build_vocabularies

    sources, targets = spanish_english_slice()
    return TranslationVectorizers(*build_vocabularies(sources, targets, 700, 500), TINY_LENGTH)


def tiny_config(vectorizers, **overrides):
    from models.translator import TranslatorConfig

    config = dict(
        source_vocabulary_size=vectorizers.source_vocabulary_size,
        target_vocabulary_size=vectorizers.target_vocabulary_size,
        sequence_length=TINY_LENGTH,
        embedding_dim=32,
        intermediate_dim=64,
        num_heads=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.0,
    )
    config.update(overrides)
    return TranslatorConfig(**config)


@functools.lru_cache(maxsize=None)
def tiny_trained_translator(epochs=4):
    """A 2+2-layer width-32 translator fitted for a few epochs on the slice (its outputs vary
    with the source, so decoding tests exercise real, non-degenerate token sequences)."""
    from models.translator import build_translator
    from models.translator import compile_translator
    from pipelines.translation_data import make_dataset

    keras.utils.set_random_seed(3)
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    dataset = make_dataset(vectorizers, sources, targets, tokens_per_batch=1024, shuffle=True, seed=3)
    model = build_translator(tiny_config(vectorizers))
    steps = epochs * int(dataset.reduce(0, lambda count, _: count + 1))
    compile_translator(model, 3e-3, steps)
    model.fit(dataset, epochs=epochs, verbose=0)
    return model, vectorizers
