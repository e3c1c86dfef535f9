"""The explorer page in a real headless Chromium, opened from disk: selectors, hover, row focus."""

import keras
import numpy as np

import keras_attn
from keras_attn.visualization import attention_maps
from keras_attn.visualization import attention_weights
from keras_attn.visualization import write_explorer
from tests.browser import open_page


def _hover(page, row, column, expected, query_word, key_word):
    """Moves the mouse over cell (`row`, `column`), checks the exact weight and both words the
    hover box shows; returns its text."""
    page.mouse.move(*_cell_centre(page, row, column))
    hover = page.locator("#hover")
    assert float(hover.get_attribute("data-value")) == float(expected)
    text = hover.inner_text()
    assert f"\u201c{query_word}\u201d" in text and f"\u201c{key_word}\u201d" in text
    return text


def _cell_centre(page, row, column):
    box = page.locator("#map").bounding_box()
    cell = page.evaluate("state.cell")
    return box["x"] + (column + 0.5) * cell, box["y"] + (row + 0.5) * cell


def test_explorer_switches_layer_and_head_and_shows_the_weights(tmp_path):
    rng = np.random.default_rng(0)
    weights = {
        "encoder/self_attention": rng.dirichlet(np.ones(6), size=(1, 2, 6)).astype(np.float32),
        "decoder/cross_attention": rng.dirichlet(np.ones(6), size=(1, 3, 4)).astype(np.float32),
    }
    source, target = ["el", "gato", "negro", "come", "pan", "."], ["the", "black", "cat", "eats"]
    maps = attention_maps(weights, {"encoder/self_attention": source, "decoder/cross_attention": target}, source)
    path = write_explorer(tmp_path / "explorer.html", maps, title="Explorer test")

    with open_page(path) as page:
        assert page.locator("#layer option").all_inner_texts() == list(weights)
        page.select_option("#layer", "1")
        assert page.locator("#head option").count() == 3
        page.select_option("#head", "2")
        for row, column in [(0, 0), (3, 5), (1, 2)]:
            expected = weights["decoder/cross_attention"][0, 2, row, column]
            hover = _hover(page, row, column, expected, target[row], source[column])
            assert hover.endswith(f"\u201c{source[column]}\u201d: {expected:.4f}")
        page.mouse.click(*_cell_centre(page, 1, 0))
        spans = page.locator("#focus span")
        assert spans.all_inner_texts() == source
        assert [spans.nth(j).get_attribute("title") for j in range(6)] == [
            f"{value:.4f}" for value in weights["decoder/cross_attention"][0, 2, 1]
        ]
        assert "\u201cblack\u201d" in page.locator("#focus-title").inner_text()
        page.select_option("#layer", "0")
        assert page.locator("#head option").count() == 2 and page.locator("#focus span").count() == 0
        page.mouse.move(*_cell_centre(page, 5, 4))
        assert float(page.locator("#hover").get_attribute("data-value")) == float(
            weights["encoder/self_attention"][0, 0, 5, 4]
        )


def test_explorer_draws_a_linformer_map_over_its_projected_keys(tmp_path):
    """A non-square map as a family returns it (queries x projected keys), captured from a model."""
    inputs = keras.Input((None, 8))
    layer = keras_attn.LinformerSelfAttention(2, 4, max_length=8, projected_length=3, name="linformer")
    model = keras.Model(inputs, layer(inputs))
    words = ["a", "film", "worth", "seeing", "twice"]
    weights = attention_weights(model, np.random.default_rng(1).standard_normal((1, 5, 8)).astype(np.float32))
    assert weights["linformer"].shape == (1, 2, 5, 3)
    projected = [f"projection {k}" for k in range(3)]
    path = write_explorer(tmp_path / "linformer.html", attention_maps(weights, words, projected), title="Linformer")

    with open_page(path) as page:
        page.select_option("#head", "1")
        for row, column in [(0, 0), (4, 2), (2, 1)]:
            _hover(page, row, column, weights["linformer"][0, 1, row, column], words[row], projected[column])
        page.mouse.click(*_cell_centre(page, 3, 0))
        assert page.locator("#focus span").all_inner_texts() == projected
