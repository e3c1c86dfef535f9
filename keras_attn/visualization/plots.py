"""Figures of attention maps with matplotlib (imported on first use: an optional dependency).

Every figure goes through `focus` first, so long inputs show a query window and their top keys,
and at most `max_ticks` labels per axis are drawn.
"""

import base64
import io

import numpy as np

from keras_attn.visualization.maps import focus


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib import pyplot
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            'Attention figures need matplotlib: `pip install "keras-attn[viz]"` (or `pip install matplotlib`).'
        ) from error
    return pyplot


def _tick_step(count, max_ticks):
    return max(1, -(-count // max_ticks))


def _draw(ax, weights, attention_map, max_ticks, labels=True):
    """One head's `(query_len, key_len)` weights as an image on `ax`; returns the image."""
    image = ax.imshow(
        weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6), aspect="auto", interpolation="nearest"
    )
    if not labels:
        ax.set_xticks([])
        ax.set_yticks([])
        return image
    for axis, tokens, set_ticks, set_labels in (
        ("x", attention_map.key_tokens, ax.set_xticks, ax.set_xticklabels),
        ("y", attention_map.query_tokens, ax.set_yticks, ax.set_yticklabels),
    ):
        ticks = np.arange(0, len(tokens), _tick_step(len(tokens), max_ticks))
        set_ticks(ticks)
        set_labels([tokens[i] for i in ticks], rotation=90 if axis == "x" else 0, fontsize=7)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    return image


def _focused_title(original, shown):
    title = original.name
    _, query_len, key_len = original.weights.shape
    _, shown_queries, shown_keys = shown.weights.shape
    if (shown_queries, shown_keys) != (query_len, key_len):
        title += (
            f"\nqueries {shown.query_positions[0]}-{shown.query_positions[-1]} of {query_len}, "
            f"top {shown_keys} of {key_len} keys"
        )
    return title


def plot_head(attention_map, head=0, max_queries=64, max_keys=64, query_start=0, max_ticks=40):
    """A heat map of one head (`query tokens x key tokens`, labelled, with a colour bar).

    Returns:
        A matplotlib `Figure`.
    """
    if not 0 <= head < attention_map.num_heads:
        raise ValueError(f"`head` must be in [0, {attention_map.num_heads}). Received: head={head}")
    pyplot = _pyplot()
    shown = focus(attention_map, max_queries, max_keys, query_start)
    figure, ax = pyplot.subplots(figsize=(7, 6), layout="constrained")
    image = _draw(ax, shown.weights[head], shown, max_ticks)
    ax.set_title(f"{_focused_title(attention_map, shown)} — head {head}", fontsize=9)
    figure.colorbar(image, ax=ax, label="attention weight")
    return figure


def plot_heads(attention_map, max_queries=64, max_keys=64, query_start=0, max_ticks=20, columns=4):
    """Every head of one layer side by side, one colour bar per head."""
    pyplot = _pyplot()
    shown = focus(attention_map, max_queries, max_keys, query_start)
    rows = -(-shown.num_heads // columns)
    columns = min(columns, shown.num_heads)
    figure, axes = pyplot.subplots(rows, columns, figsize=(4 * columns, 4 * rows), layout="constrained", squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= shown.num_heads:
            ax.axis("off")
            continue
        image = _draw(ax, shown.weights[head], shown, max_ticks)
        ax.set_title(f"head {head}", fontsize=9)
        figure.colorbar(image, ax=ax, shrink=0.8)
    figure.suptitle(_focused_title(attention_map, shown), fontsize=10)
    return figure


def plot_model(attention_maps, max_queries=64, max_keys=64, labelled=False, max_ticks=30):
    """An overview: one row per layer, one thumbnail per head (with token labels if `labelled`)."""
    if not attention_maps:
        raise ValueError("`attention_maps` is empty: nothing to draw.")
    pyplot = _pyplot()
    columns = max(attention_map.num_heads for attention_map in attention_maps)
    rows = len(attention_maps)
    size = 4.0 if labelled else 2.2
    figure, axes = pyplot.subplots(
        rows, columns, figsize=(size * columns, size * rows + 0.4), layout="constrained", squeeze=False
    )
    for row, attention_map in enumerate(attention_maps):
        shown = focus(attention_map, max_queries, max_keys)
        for head in range(columns):
            ax = axes[row, head]
            if head >= shown.num_heads:
                ax.axis("off")
                continue
            _draw(ax, shown.weights[head], shown, max_ticks, labels=labelled)
            ax.set_title(f"{attention_map.name} — head {head}" if labelled else f"head {head}", fontsize=8)
        if not labelled:
            axes[row, 0].set_ylabel(attention_map.name, fontsize=7)
    return figure


def save_figure(figure, path, dpi=100):
    """Writes `figure` as PNG (or any format matplotlib knows from the suffix) and closes it."""
    try:
        figure.savefig(path, dpi=dpi)
    finally:
        _pyplot().close(figure)
    return path


def figure_data_uri(figure, dpi=100):
    """`figure` as a `data:image/png;base64,...` URI (for self-contained pages); closes it."""
    buffer = io.BytesIO()
    save_figure(figure, buffer, dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
