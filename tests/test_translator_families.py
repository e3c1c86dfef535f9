"""The translator with each self-attention choice (`--attention dense | window | linear`): it
trains, its cached greedy and beam decoders equal Python searches over full forward passes, the
window bounds what a token sees, and the export writes a SavedModel that a fresh process serves
like Keras, with ONNX graphs where the family's declared cache allows, else a clear error."""

import os
import tempfile

import keras
import numpy as np
import pytest

from export.translator import verified_export
from models.decoding import translate_ids
from models.decoding_defaults import GREEDY_SIGNATURE
from models.translation_text import detokenize
from models.translator import build_translator
from models.translator_self_attention import CHOICES
from pipelines import train_translator
from pipelines.batching import with_counted_batches
from pipelines.translation_data import make_dataset
from tests.test_decoding import _oracle_beam
from tests.test_decoding import _oracle_greedy
from tests.translation_fixtures import spanish_english_slice
from tests.translation_fixtures import tiny_config
from tests.translation_fixtures import tiny_translator
from tests.translation_fixtures import tiny_vectorizers

pytestmark = pytest.mark.slow
WINDOW = 3


def _translator(attention):
    return tiny_translator(attention=attention, attention_window=WINDOW)


def _sources(count, begin=0):
    model, vectorizers = _translator("dense")
    return vectorizers.source_ids(spanish_english_slice()[0][begin : begin + count]).numpy()


@pytest.mark.parametrize("attention", CHOICES)
def test_a_few_training_steps_lower_the_loss(attention):
    vectorizers = tiny_vectorizers()
    keras.utils.set_random_seed(0)
    model = build_translator(tiny_config(vectorizers, attention=attention, attention_window=WINDOW))
    train_translator.compile_translator(model, 3e-3, total_steps=12)
    sources, targets = spanish_english_slice()
    batches = with_counted_batches(
        make_dataset(vectorizers, sources[:256], targets[:256], tokens_per_batch=512).take(4)
    )
    before = model.evaluate(batches, verbose=0, return_dict=True)["loss"]
    model.fit(batches, epochs=3, shuffle=False, verbose=0)
    assert model.evaluate(batches, verbose=0, return_dict=True)["loss"] < before - 0.5


@pytest.mark.parametrize("attention", CHOICES)
def test_greedy_and_beam_decoding_equal_searches_over_full_forward_passes(attention):
    model, vectorizers = _translator(attention)
    source_ids = _sources(3)
    ends = (vectorizers.start_id, vectorizers.end_id)
    greedy = translate_ids(model, source_ids, *ends, max_length=10).numpy()
    beam = translate_ids(model, source_ids, *ends, max_length=6, beam_size=2).numpy()
    for source, greedy_row, beam_row in zip(source_ids, greedy, beam):
        assert greedy_row.tolist() == _oracle_greedy(model, source, *ends, 10)
        assert beam_row.tolist() == _oracle_beam(model, source, *ends, 6, 2)
    # The cache of each family gives the tokens of full recomputation on a whole batch too.
    many = _sources(24)
    for beam_size in (1, 3):
        cached = translate_ids(model, many, *ends, beam_size=beam_size).numpy()
        assert len({tuple(row) for row in cached}) > 3  # not one translation for every sentence
        np.testing.assert_array_equal(cached, translate_ids(model, many, *ends, beam_size=beam_size, use_cache=False))


def test_a_window_limits_how_far_back_the_decoder_sees():
    """Two decoder blocks of window 3: position `i` reads target tokens `i - 4 .. i` only."""
    model, vectorizers = _translator("window")
    source_ids = _sources(2)
    target = np.random.default_rng(0).integers(4, vectorizers.target_vocabulary_size, (2, 9)).astype("int32")
    changed = target.copy()
    changed[:, 0] = 3
    difference = np.abs(keras.ops.convert_to_numpy(model((source_ids, target)) - model((source_ids, changed))))
    reach = model.num_decoder_layers * (WINDOW - 1)
    assert difference[:, reach + 1 :].max() == 0.0 and difference[:, reach].min(axis=-1).max() > 0.0
    dense_model, _ = _translator("dense")
    assert (
        np.abs(keras.ops.convert_to_numpy(dense_model((source_ids, target)) - dense_model((source_ids, changed))))[
            :, reach + 1 :
        ]
        .min(axis=-1)
        .max()
        > 0.0
    )


def _keras_translations(model, vectorizers, sentences):
    ids = translate_ids(model, vectorizers.source_ids(sentences), vectorizers.start_id, vectorizers.end_id)
    return detokenize([vectorizers.target_tokens(row) for row in ids.numpy()])


# The default family's export (dense, the same tiny translator) and its checks are
# tests/test_translator_export.py's, shared by its tests: here the other families only.
@pytest.mark.parametrize("attention", [choice for choice in CHOICES if choice != "dense"])
def test_export_serves_like_keras_with_onnx_where_the_family_allows(attention):
    model, vectorizers = _translator(attention)
    sentences = spanish_english_slice()[0][:12] + ["¿Quién es Zyxwv?", ""]
    export_dir = tempfile.mkdtemp(prefix=f"translator-{attention}-")
    key_value = type(model.decoder_layers[0].self_attention).capabilities.cache == "key_value"
    if not key_value:
        message = r"\(LinearAttention\) declares cache='recurrent'.*--no-onnx.*Received: attention='linear'"
        with pytest.raises(ValueError, match=message):
            verified_export.export_translator(model, vectorizers, export_dir, sentences)
        assert not os.listdir(export_dir)  # refused before anything was written
    path, report = verified_export.export_translator(model, vectorizers, export_dir, sentences, onnx=key_value)
    assert report["saved_model_matches"] and report.get("onnx_matches", False) == key_value
    assert os.path.isdir(os.path.join(path, "onnx")) == key_value
    others = spanish_english_slice()[0][300:308]
    greedy = verified_export.reload_translations(
        path, others, GREEDY_SIGNATURE
    )  # beam: tests/test_translator_export.py
    assert greedy == _keras_translations(model, vectorizers, others)
    if key_value:
        source_ids = _sources(5, begin=320)[:, :11]
        expected = translate_ids(model, source_ids, vectorizers.start_id, vectorizers.end_id).numpy()
        np.testing.assert_array_equal(
            verified_export.OnnxGreedyDecoder(os.path.join(path, "onnx"))(source_ids), expected
        )


def test_the_attention_flag_reaches_the_config_and_a_bad_choice_names_it():
    args = train_translator.parse_args(["--smoke", "--attention", "window", "--attention-window", "5"])
    config = train_translator.model_config(args)
    assert (config.attention, config.attention_window) == ("window", 5)
    with pytest.raises(
        ValueError, match=r"`attention` must be one of \('dense', 'window', 'linear'\)\. Received: attention='lsh'"
    ):
        train_translator.model_config(train_translator.parse_args(["--smoke", "--attention", "lsh"]))
