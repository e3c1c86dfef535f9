"""`translate --attention`: the cross-attention alignments of each translation, as a page or PNGs."""

import io
from contextlib import redirect_stdout

import numpy as np
import pytest

from keras_attn.visualization.explorer import decode_weights
from keras_attn.visualization.explorer import embedded_data
from models.decoding import make_decoder
from models.decoding_defaults import BEAM_SIZE
from models.decoding_defaults import LENGTH_PENALTY
from models.translator_attention import alignment_maps
from models.translator_attention import produced_tokens
from pipelines import translate
from tests.test_visualization_figures import assert_png
from tests.translation_fixtures import tiny_translator
from tests.translation_fixtures import write_tiny_run

SENTENCES = ["Tengo hambre.", "¿Dónde está la estación de tren?"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as training leaves it (model, vocabularies, run_config), without training."""
    return write_tiny_run(tmp_path_factory.mktemp("translator_run"))


def test_alignment_rows_are_the_produced_tokens_over_the_source_tokens():
    model, vectorizers = tiny_translator()
    target_ids = make_decoder(model, vectorizers)(vectorizers.source_ids(SENTENCES[1:])).numpy()[0]
    tokens, _ = produced_tokens(vectorizers, target_ids)

    maps = alignment_maps(model, vectorizers, SENTENCES[1], target_ids)

    assert [m.name for m in maps] == [block.cross_attention.path for block in model.decoder_layers]
    source_tokens = ["¿", "dónde", "está", "la", "estación", "de", "tren", "?"]
    vocabulary = vectorizers.source.get_vocabulary()
    expected_keys = [token if token in vocabulary else "[UNK]" for token in source_tokens]
    for attention_map in maps:
        assert attention_map.weights.shape == (2, len(tokens), len(source_tokens))
        assert list(attention_map.key_tokens) == expected_keys
        assert list(attention_map.query_tokens) == tokens
        np.testing.assert_allclose(attention_map.weights.sum(axis=-1), 1.0, atol=1e-5)


def test_translate_attention_html_embeds_the_alignments_of_each_sentence(run_dir, tmp_path):
    page_path = tmp_path / "alignment.html"
    printed = io.StringIO()
    with redirect_stdout(printed):
        translate.main(["--run", str(run_dir), "--attention", str(page_path), *SENTENCES])

    translations = printed.getvalue().splitlines()
    assert len(translations) == 2
    page = page_path.read_text()
    assert "://" not in page
    layers = embedded_data(page)["layers"]
    model, vectorizers = tiny_translator()
    decoder = make_decoder(
        model, vectorizers, beam_size=BEAM_SIZE, length_penalty=LENGTH_PENALTY
    )  # the command's default
    expected = []
    for index, sentence in enumerate(SENTENCES):
        target_ids = decoder(vectorizers.source_ids([sentence])).numpy()[0]
        expected += [
            (f"{index + 1}. {sentence} | {m.name}", m) for m in alignment_maps(model, vectorizers, sentence, target_ids)
        ]
    assert [layer["name"] for layer in layers] == [name for name, _ in expected]
    for layer, (_, attention_map) in zip(layers, expected):
        np.testing.assert_array_equal(decode_weights(layer), attention_map.weights)
        assert layer["key_tokens"] == list(attention_map.key_tokens)


def test_translate_attention_png_writes_one_figure_per_sentence(run_dir, tmp_path):
    with redirect_stdout(io.StringIO()):
        translate.main(["--run", str(run_dir), "--attention", str(tmp_path / "a.png"), *SENTENCES])
    for name in ("a.png", "a_2.png"):
        assert_png(tmp_path / name, 800, 840)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--export", "x", "--attention", "a.html", "hola"], "--attention needs --run"),
        (["--run", "x", "--attention", "a.svg", "hola"], "--attention must end in .html or .png, got 'a.svg'"),
    ],
)
def test_bad_attention_flags_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        translate.main(argv)
    assert message in capsys.readouterr().err
