"""MkDocs hook: the home page shows the version it documents, `keras_attn.__version__` read from
`keras_attn/version.py` (statically: no TensorFlow import) where the page says `{{ version }}`."""

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
HOME = "index.md"
MARKER = "{{ version }}"


def version():
    """`__version__` as `keras_attn/version.py` writes it."""
    for node in ast.parse((REPO_ROOT / "keras_attn" / "version.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("keras_attn/version.py defines no __version__")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != HOME:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{HOME} must show the version: write {MARKER} where it goes")
    return markdown.replace(MARKER, version())
