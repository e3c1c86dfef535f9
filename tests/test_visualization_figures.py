"""Figures and the explorer page: PNGs of the expected size with content; the page is offline and exact."""

import re

import numpy as np
import pytest

from keras_attn.visualization import attention_maps
from keras_attn.visualization import explorer_html
from keras_attn.visualization import plot_head
from keras_attn.visualization import plot_heads
from keras_attn.visualization import plot_model
from keras_attn.visualization import save_figure
from keras_attn.visualization.explorer import decode_weights
from keras_attn.visualization.explorer import embedded_data


def random_weights(heads, query_len, key_len, seed=0):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(key_len) * 0.3, size=(1, heads, query_len)).astype(np.float32)


def assert_png(path, width, height):
    from matplotlib import image

    pixels = image.imread(path)  # (height, width, channels) floats in [0, 1]
    assert pixels.shape[:2] == (height, width)
    colours = np.unique(pixels[..., :3].reshape(-1, 3).round(2), axis=0)
    assert len(colours) > 50, f"{path} looks blank: {len(colours)} colours"


def test_head_grid_and_overview_pngs_have_the_expected_size_and_content(tmp_path):
    tokens = [f"w{i}" for i in range(12)]
    maps = attention_maps(
        {
            "encoder_0/self_attention": random_weights(4, 12, 12),
            "encoder_1/self_attention": random_weights(4, 12, 12, 1),
        },
        tokens,
    )
    assert_png(save_figure(plot_head(maps[0], head=2), tmp_path / "head.png"), 700, 600)
    assert_png(save_figure(plot_heads(maps[0]), tmp_path / "heads.png"), 1600, 400)
    assert_png(save_figure(plot_model(maps), tmp_path / "model.png"), 880, 480)
    with pytest.raises(ValueError, match="head"):
        plot_head(maps[0], head=4)


def test_long_input_is_focused_with_bounded_tick_labels(tmp_path):
    length = 3000
    (long_map,) = attention_maps({"long": random_weights(1, length, length)}, [f"t{i}" for i in range(length)])
    figure = plot_head(long_map, max_queries=50, max_keys=80, max_ticks=40)
    ax = figure.axes[0]
    assert len(ax.get_xticklabels()) <= 40 and len(ax.get_yticklabels()) <= 40
    assert ax.images[0].get_array().shape == (50, 80)
    assert "top 80 of 3000 keys" in ax.get_title()
    save_figure(figure, tmp_path / "long.png")


def test_explorer_page_is_offline_and_embeds_the_exact_weights():
    weights = {"decoder/cross_attention": random_weights(2, 5, 7), "encoder/self_attention": random_weights(3, 7, 7, 1)}
    source = ["</script>", "http://example.com/x", 'src="//cdn"', "d", "e", "f", "g"]
    target = ["A", "b", "c", "d", "e"]
    maps = attention_maps(
        weights,
        {"decoder/cross_attention": target, "encoder/self_attention": source},
        {"decoder/cross_attention": source, "encoder/self_attention": source},
    )

    page = explorer_html(maps, title="t <b>", subtitle="p(positive) = 0.93")

    assert "://" not in page and "//cdn" not in page
    markup = re.sub(r'(<script type="application/json" id="attention-data">).*?(</script>)', r"\1\2", page, flags=re.S)
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\b(src|href)\s*=|@import|url\(", markup, re.IGNORECASE)
    assert page.count("</script>") == 2  # the data block's and the program's, nothing from a token
    assert "t &lt;b&gt;" in page
    data = embedded_data(page)
    assert [layer["name"] for layer in data["layers"]] == list(weights)
    for record, layer_weights in zip(data["layers"], weights.values()):
        np.testing.assert_array_equal(decode_weights(record), layer_weights[0])
    assert data["layers"][0]["key_tokens"] == source and data["layers"][0]["query_tokens"] == target


def test_explorer_focuses_long_inputs_and_refuses_oversized_pages():
    length = 1500
    (long_map,) = attention_maps({"long": random_weights(2, length, length)}, [str(i) for i in range(length)])
    record = embedded_data(explorer_html([long_map], max_queries=100, max_keys=200))["layers"][0]
    assert record["shape"] == [2, 100, 200] and record["full_shape"] == [length, length]
    np.testing.assert_array_equal(decode_weights(record), long_map.weights[:, :100][:, :, record["key_positions"]])
    with pytest.raises(ValueError, match="max_queries"):
        explorer_html([long_map], max_queries=length, max_keys=length)
