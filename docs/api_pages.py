"""MkDocs hook: one API page per public name, grouped in the navigation the way keras.io groups
Keras's, and the index of them all.

The public names are `keras_attn.__all__` and `keras_attn.visualization.__all__`, read statically
(no TensorFlow import). `SECTIONS` puts each in one navigation section; a public name it does not
place (or a name it places that is not public) stops the build, so a new public name cannot miss
the navigation. `tests/test_docs_site.py` checks the built site.
"""

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
API_INDEX = "api/index.md"
NAV_TITLE = "API reference"

# The navigation of the reference: section title -> its public names, in reading order.
SECTIONS = {
    "Layers": ["MultiHeadAttention", "SelfAttention", "CausalSelfAttention", "CrossAttention"],
    "Attention families": ["attention_families", "LinearAttention", "LinformerSelfAttention", "LSHSelfAttention"],
    "Positions and biases": [
        "RotaryEmbedding",
        "ALiBi",
        "RelativePositionBias",
        "PositionEmbedding",
        "SinusoidalPositionEncoding",
        "TokenAndPositionEmbedding",
    ],
    "Blocks": ["TransformerEncoder", "TransformerDecoder", "FeedForward", "AttentionPooling", "MaskedGlobalPooling"],
    "Patterns": ["patterns"],
    "Kernels and ops": [
        "scaled_dot_product_attention",
        "explain_implementation",
        "set_measured_dispatch",
        "tune",
        "masked_softmax",
        "causal_mask",
        "sliding_window_mask",
        "merge_masks",
        "ops",
    ],
    "Packing": ["packing", "document_positions"],
    "Conversion": ["convert", "enable", "disable"],
    "Visualization": [
        "visualization.attention_weights",
        "visualization.AttentionCapture",
        "visualization.attention_maps",
        "visualization.AttentionMap",
        "visualization.focus",
        "visualization.plot_head",
        "visualization.plot_heads",
        "visualization.plot_model",
        "visualization.save_figure",
        "visualization.figure_data_uri",
        "visualization.explorer_html",
        "visualization.write_explorer",
        "visualization.token_highlight_html",
    ],
}
PUBLIC_MODULES = {"": "keras_attn/__init__.py", "visualization.": "keras_attn/visualization/__init__.py"}


def module_all(path):
    """The `__all__` of the module at `path` (a Python file), without the dunder entries."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if not name.startswith("__")]
    raise RuntimeError(f"{path} defines no __all__")


def public_names():
    """Every public name, relative to `keras_attn` (`MultiHeadAttention`, `visualization.focus`)."""
    return [prefix + name for prefix, path in PUBLIC_MODULES.items() for name in module_all(REPO_ROOT / path)]


def checked_sections(sections, names):
    """`sections`, after checking that they place each of `names` exactly once and nothing else."""
    placed = [name for members in sections.values() for name in members]
    unplaced = sorted(set(names) - set(placed))
    unknown = sorted(set(placed) - set(names))
    twice = sorted({name for name in placed if placed.count(name) > 1})
    if unplaced or unknown or twice:
        raise ValueError(
            f"docs/api_pages.py SECTIONS must place every public name once: not placed {unplaced}, "
            f"not public {unknown}, placed twice {twice}"
        )
    return sections


def page_path(name):
    return f"api/{name.replace('.', '/')}.md"


def api_nav():
    """The "API reference" navigation: the index, then one section per group of `SECTIONS`."""
    sections = checked_sections(SECTIONS, public_names())
    groups = [{title: [{name.split(".")[-1]: page_path(name)} for name in names]} for title, names in sections.items()]
    return {NAV_TITLE: [API_INDEX, *groups]}


def on_config(config):
    config["nav"] = [api_nav() if item == {NAV_TITLE: API_INDEX} else item for item in config["nav"]]
    return config


def on_files(files, config):
    from mkdocs.structure.files import File  # the hook's only use of MkDocs: the checks above run without it

    for names in SECTIONS.values():
        for name in names:
            files.append(File.generated(config, page_path(name), content=f"::: keras_attn.{name}\n"))
    index = ["# API reference", "", "Every public name of `keras_attn`, one page each, by what it is for.", ""]
    for title, names in SECTIONS.items():
        index += [f"## {title}", ""]
        index += [f"- [`keras_attn.{name}`]({page_path(name)[len('api/') :]})" for name in names]
        index.append("")
    files.append(File.generated(config, API_INDEX, content="\n".join(index)))
    return files
