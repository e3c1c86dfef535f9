"""MkDocs hook: one API page per public name of `keras_attn` (its `__all__`), and their index.

The names are read from `keras_attn/__init__.py` statically (no TensorFlow import), so a new public
name gets its page without anyone editing the docs; `tests/test_docs_site.py` checks the site.
"""

import ast
from pathlib import Path

from mkdocs.structure.files import File

PACKAGE = Path(__file__).resolve().parents[1] / "keras_attn" / "__init__.py"


def public_names():
    """`keras_attn.__all__` without the dunder entries (`__version__` is on the index page)."""
    for node in ast.parse(PACKAGE.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if not name.startswith("__")]
    raise RuntimeError(f"{PACKAGE} defines no __all__")


def on_files(files, config):
    names = public_names()
    for name in names:
        files.append(File.generated(config, f"api/{name}.md", content=f"::: keras_attn.{name}\n"))
    index = ["# API reference", "", "Every public name of `keras_attn`, one page each.", ""]
    index += [f"- [`keras_attn.{name}`]({name}.md)" for name in names]
    files.append(File.generated(config, "api/index.md", content="\n".join(index) + "\n"))
    return files
