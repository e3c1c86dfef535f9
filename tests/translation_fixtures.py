"""Small slices of the real Tatoeba English-Spanish pairs and a tiny translator, cached.

The data is read from `../shared/data/spa-eng/spa-eng.zip` (never copied into the repository);
tests that need it are skipped when the file is not there, and fail under `CI=true`. Everything is built once per process.
"""

import functools
import json
from pathlib import Path

import keras
import numpy as np

from tests.shared_data import missing_shared_data

SPA_ENG_ZIP = Path(__file__).resolve().parents[2] / "shared" / "data" / "spa-eng" / "spa-eng.zip"
TINY_LENGTH = 16


def require_data():
    if not SPA_ENG_ZIP.is_file():
        missing_shared_data(f"the shared data set is not at {SPA_ENG_ZIP}")
    return SPA_ENG_ZIP


@functools.cache
def spanish_english_slice(count=1_200, seed=7):
    """`count` random (Spanish, English) pairs of at most 10 words, from the whole file."""
    from models.parallel_text import orient_pairs
    from models.parallel_text import read_pairs

    sources, targets = orient_pairs(read_pairs(require_data()), ("en", "es"), "es", "en")
    short = [i for i, text in enumerate(sources) if len(text.split()) <= 10]
    chosen = np.random.default_rng(seed).choice(short, size=count, replace=False)
    return [sources[i] for i in chosen], [targets[i] for i in chosen]


@functools.cache
def tiny_vectorizers():
    from models.translation_text import TranslationVectorizers
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


@functools.cache
def tiny_translator(tie_embeddings=False, sharpen=4.0, end_bias=3.5, attention="dense", attention_window=8):
    """A 2+2-layer width-32 translator with sharpened random weights (no training: cheap), its
    self-attention the `attention` choice (`models.translator_self_attention`).

    The output projection is scaled by `sharpen` so that logits spread widely (far from ties)
    and the `[end]` logit is raised by `end_bias`, so that hypotheses differ per source and
    finish after different numbers of steps: decoding tests see varied token sequences.
    """
    from models.translator import build_translator

    keras.utils.set_random_seed(3)
    vectorizers = tiny_vectorizers()
    model = build_translator(
        tiny_config(vectorizers, tie_embeddings=tie_embeddings, attention=attention, attention_window=attention_window)
    )
    if tie_embeddings:
        table = model.target_embedding.token_embedding.embeddings
    else:
        table = model.output_projection.kernel
    table.assign(table * sharpen)
    bias = np.zeros(model.target_vocabulary_size, "float32")
    bias[vectorizers.end_id] = end_bias
    (model.output_bias if tie_embeddings else model.output_projection.bias).assign(bias)
    return model, vectorizers


def write_tiny_run(directory):
    """`tiny_translator` as a run directory, the way training leaves it (model, vocabularies,
    run_config), without training; returns `directory`."""
    model, vectorizers = tiny_translator()
    model.save(Path(directory) / "translator.keras")
    vectorizers.save(str(directory))
    (Path(directory) / "run_config.json").write_text(json.dumps({"source": "es", "target": "en"}))
    return directory
