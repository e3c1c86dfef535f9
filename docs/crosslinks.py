"""Cross-links between names: a code span that is a public name, `keras_attn.ALiBi` (any public name
spelt in full) or `ALiBi` (a public class by its own name), becomes a link to its API page, in the
docstrings (`CrossLinks`, a griffe extension) and in the guides (`on_page_markdown`, a MkDocs hook).
The links are autorefs (`[text][identifier]`): a name without a page fails the strict build.
Fenced code blocks are left as they are.
"""

import re
import sys
from pathlib import Path

import griffe

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # griffe loads this file by its path, outside any package

from docs import api_pages  # noqa: E402  (needs the path above)

_FENCE = re.compile(r"(?ms)^([ \t]*)(```|~~~).*?^\1\2[ \t]*$")
_CODE_SPAN = re.compile(r"(?<![\[`\w])`([\w.]+)`(?![`\]\w])")


def identifiers():
    """`{code span text: identifier}`: every public name in full, every public class by itself."""
    names = api_pages.public_names()
    linked = {f"keras_attn.{name}": f"keras_attn.{name}" for name in names}
    linked.update({name: f"keras_attn.{name}" for name in names if "." not in name and name[0].isupper()})
    return linked


def linked(markdown, names):
    """`markdown` with each code span in `names` (`identifiers()`) made a link, outside fenced code."""

    def link(span):
        identifier = names.get(span[1])
        return f"[{span[0]}][{identifier}]" if identifier else span[0]

    pieces, start = [], 0
    for fence in _FENCE.finditer(markdown):
        pieces += [_CODE_SPAN.sub(link, markdown[start : fence.start()]), fence[0]]
        start = fence.end()
    return "".join([*pieces, _CODE_SPAN.sub(link, markdown[start:])])


class CrossLinks(griffe.Extension):
    def __init__(self):
        super().__init__()
        self.names = identifiers()

    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = linked(obj.docstring.value, self.names)


def on_page_markdown(markdown, page, config, files):
    return linked(markdown, identifiers())
