"""A self-contained HTML page to explore attention maps: opened from disk, it needs no network.

The weights travel inline as base64 float32 (exact, about 5.3 bytes per weight) in a JSON
`<script id="attention-data">` block; every "/" in it is written "\\/", so neither a token nor a
name can close the script or form a URL. The page draws the selected layer and head on a canvas,
shows the weight under the pointer, and on a click focuses that query row: its keys as tokens
shaded by weight, strongest first.
"""

import base64
import html
import json
import pathlib

import numpy as np

from keras_attn.visualization.maps import focus

_MAX_CELLS = 2_000_000


def _layer_record(attention_map, max_queries, max_keys):
    shown = focus(attention_map, max_queries, max_keys)
    weights = np.ascontiguousarray(shown.weights, dtype="<f4")  # (heads, query_len, key_len)
    _, query_len, key_len = attention_map.weights.shape
    return {
        "name": shown.name,
        "shape": list(weights.shape),
        "full_shape": [int(query_len), int(key_len)],
        "query_tokens": list(shown.query_tokens),
        "key_tokens": list(shown.key_tokens),
        "query_positions": [int(p) for p in shown.query_positions],
        "key_positions": [int(p) for p in shown.key_positions],
        "weights": base64.b64encode(weights.tobytes()).decode("ascii"),
    }


def explorer_data(attention_maps, max_queries=512, max_keys=512):
    """What the page embeds: one record per layer (`focus`ed to at most `max_queries x max_keys`); may be none."""
    layers = [_layer_record(attention_map, max_queries, max_keys) for attention_map in attention_maps]
    cells = sum(int(np.prod(layer["shape"])) for layer in layers)
    if cells > _MAX_CELLS:
        raise ValueError(
            f"The page would embed {cells:,} weights (more than {_MAX_CELLS:,}). Lower `max_queries` "
            f"or `max_keys`. Received: max_queries={max_queries}, max_keys={max_keys}"
        )
    return {"layers": layers}


def decode_weights(layer_record):
    """The float32 `(heads, query_len, key_len)` array of one embedded layer record."""
    flat = np.frombuffer(base64.b64decode(layer_record["weights"]), dtype="<f4")
    return flat.reshape(layer_record["shape"])


def embedded_data(page):
    """The data block of a page written by `explorer_html` (what the tests and reports read back)."""
    start = page.index('<script type="application/json" id="attention-data">')
    start = page.index(">", start) + 1
    return json.loads(page[start : page.index("</script>", start)])


def token_highlight_html(tokens, scores, title="Attention received per token"):
    """An HTML fragment: `tokens` shaded by `scores` (darkest = highest), each score on hover."""
    scores = np.asarray(scores, np.float64)
    if scores.shape != (len(tokens),):
        raise ValueError(f"`scores` must have one value per token ({len(tokens)}). Received: shape={scores.shape}")
    top = max(float(scores.max(initial=0.0)), 1e-12)
    spans = "".join(
        f'<span class="token" title="{score:.4f}" style="background:rgba(220,60,30,{score / top:.3f})">'
        f"{html.escape(str(token))}</span> "
        for token, score in zip(tokens, scores)
    )
    return f'<h2>{html.escape(title)}</h2><p class="highlight">{spans}</p>'


def explorer_html(
    attention_maps, title="Attention explorer", subtitle="", max_queries=512, max_keys=512, extra_html=""
):
    """The explorer page as a string: layer and head selectors, hover values, query-row focus.

    Args:
        attention_maps: `AttentionMap`s (see `attention_maps`), one per layer.
        title: the page's heading.
        subtitle: a line under it (e.g. the input and the prediction).
        max_queries: a map with more queries is `focus`ed (a window of queries) and says so.
        max_keys: a map with more keys is `focus`ed (the keys most attended to) and says so.
        extra_html: trusted HTML put above the explorer (e.g. `token_highlight_html`, figures as
            `data:` images); it must not load anything from the network.
    """
    data = json.dumps(explorer_data(attention_maps, max_queries, max_keys)).replace("/", "\\/")
    return (
        _PAGE.replace("$TITLE", html.escape(title))
        .replace("$SUBTITLE", html.escape(subtitle))
        .replace("$EXTRA", extra_html)
        .replace("$DATA", data)
    )


def write_explorer(path, attention_maps, **kwargs):
    """Writes `explorer_html(attention_maps, **kwargs)` to `path` (UTF-8); returns the path."""
    path = pathlib.Path(path)
    path.write_text(explorer_html(attention_maps, **kwargs), encoding="utf-8")
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>$TITLE</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
#controls{margin:.6em 0}#controls label{margin-right:1em}
#wrap{position:relative;display:inline-block}
canvas{border:1px solid #ccc;image-rendering:pixelated;cursor:crosshair}
#hover{font-family:monospace;min-height:1.4em;margin:.4em 0}
#note{color:#a40}
.highlight{line-height:1.9;max-width:60em}.token{padding:1px 2px;border-radius:3px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
#focus span{display:inline-block;margin:1px;padding:1px 3px;border-radius:3px;font-family:monospace}
</style></head><body>
<h1>$TITLE</h1><p>$SUBTITLE</p>
$EXTRA
<h2>Attention maps</h2>
<div id="controls">
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
</div>
<p id="note"></p>
<div id="wrap"><canvas id="map" width="10" height="10"></canvas></div>
<div id="hover">Hover over a cell for its weight; click a row to focus that query.</div>
<h3 id="focus-title"></h3><div id="focus"></div>
<script type="application/json" id="attention-data">$DATA</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("attention-data").textContent);
const layers = DATA.layers.map(function (layer) {
  const bytes = Uint8Array.from(atob(layer.weights), function (c) { return c.charCodeAt(0); });
  return Object.assign({}, layer, {values: new Float32Array(bytes.buffer)});
});
const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
const canvas = document.getElementById("map"), context = canvas.getContext("2d");
const state = {layer: 0, head: 0, row: null, cell: 1};
function weight(layer, head, row, column) {
  const shape = layer.shape;
  return layer.values[(head * shape[1] + row) * shape[2] + column];
}
function colour(value, max) {
  const t = max > 0 ? Math.min(1, value / max) : 0;
  return "rgb(" + Math.round(255 - 230 * t) + "," + Math.round(255 - 170 * t) + "," + Math.round(255 - 60 * t) + ")";
}
function draw() {
  const layer = layers[state.layer], rows = layer.shape[1], columns = layer.shape[2];
  state.cell = Math.max(1, Math.min(24, Math.floor(640 / Math.max(rows, columns))));
  canvas.width = columns * state.cell; canvas.height = rows * state.cell;
  let max = 0;
  for (let i = 0; i < rows; i++) for (let j = 0; j < columns; j++) max = Math.max(max, weight(layer, state.head, i, j));
  for (let i = 0; i < rows; i++) for (let j = 0; j < columns; j++) {
    context.fillStyle = colour(weight(layer, state.head, i, j), max);
    context.fillRect(j * state.cell, i * state.cell, state.cell, state.cell);
  }
  if (state.row !== null) {
    context.strokeStyle = "#d00"; context.lineWidth = 2;
    context.strokeRect(1, state.row * state.cell, canvas.width - 2, state.cell);
  }
  const full = layer.full_shape;
  document.getElementById("note").textContent = (rows < full[0] || columns < full[1])
    ? "Long input: queries " + layer.query_positions[0] + "-" + layer.query_positions[rows - 1] + " of " + full[0] + ", the " + columns + " keys (of " + full[1] + ") that receive the most attention."
    : "";
  showFocus();
}
function cellAt(event) {
  const box = canvas.getBoundingClientRect();
  const column = Math.floor((event.clientX - box.left) / state.cell), row = Math.floor((event.clientY - box.top) / state.cell);
  const layer = layers[state.layer];
  if (row < 0 || column < 0 || row >= layer.shape[1] || column >= layer.shape[2]) return null;
  return [row, column];
}
function showFocus() {
  const target = document.getElementById("focus"), title = document.getElementById("focus-title");
  target.textContent = ""; title.textContent = "";
  if (state.row === null) return;
  const layer = layers[state.layer], columns = layer.shape[2];
  title.textContent = "Query " + layer.query_positions[state.row] + " \\u201c" + layer.query_tokens[state.row] + "\\u201d attends to";
  let max = 0;
  for (let j = 0; j < columns; j++) max = Math.max(max, weight(layer, state.head, state.row, j));
  for (let j = 0; j < columns; j++) {
    const value = weight(layer, state.head, state.row, j), span = document.createElement("span");
    span.textContent = layer.key_tokens[j]; span.title = value.toFixed(4);
    span.style.background = colour(value, max);
    target.appendChild(span);
  }
}
canvas.addEventListener("mousemove", function (event) {
  const cell = cellAt(event), hover = document.getElementById("hover");
  if (!cell) { hover.textContent = ""; return; }
  const layer = layers[state.layer], value = weight(layer, state.head, cell[0], cell[1]);
  hover.textContent = "query " + layer.query_positions[cell[0]] + " \\u201c" + layer.query_tokens[cell[0]] + "\\u201d \\u2192 key " + layer.key_positions[cell[1]] + " \\u201c" + layer.key_tokens[cell[1]] + "\\u201d: " + value.toFixed(4);
  hover.dataset.value = String(value);
});
canvas.addEventListener("click", function (event) {
  const cell = cellAt(event);
  state.row = cell && state.row !== cell[0] ? cell[0] : null; draw();
});
function fillHeads() {
  headSelect.textContent = "";
  for (let h = 0; h < layers[state.layer].shape[0]; h++) headSelect.add(new Option("head " + h, String(h)));
  state.head = 0;
}
layers.forEach(function (layer, index) { layerSelect.add(new Option(layer.name, String(index))); });
layerSelect.addEventListener("change", function () { state.layer = Number(layerSelect.value); state.row = null; fillHeads(); draw(); });
headSelect.addEventListener("change", function () { state.head = Number(headSelect.value); draw(); });
if (layers.length) { fillHeads(); draw(); }
else { document.getElementById("controls").textContent = "No attention maps in this page."; }
</script></body></html>
"""
