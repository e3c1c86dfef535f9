"""Cross-links between names: a code span that is a public name, `keras_attn.ALiBi` (any public name
spelt in full) or `ALiBi` (a public class by its own name), becomes a link to its API page, in the
docstrings (`CrossLinks`, a griffe extension) and in the guides (`on_page_markdown`, a MkDocs hook).
The links are autorefs (`[text][identifier]`): a name without a page fails the strict build.
Fenced code blocks are left as they are. Back the other way, each API page ends with the guides
and model cards that name it (`guides_naming`).
"""

import posixpath
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


GUIDE_FOLDERS = ("guides", "models")  # the pages that teach, under docs/


def named_in(text, name):
    """Whether `text` (a page, its code included) uses the public `name`: spelt in full
    (`keras_attn.packing`), imported (`from keras_attn.visualization import focus`), or, for a class
    or a submodule's name (distinctive words), by itself (`ALiBi`, `visualization.plot_head`)."""
    if re.search(rf"\bkeras_attn\.{re.escape(name)}\b", text):
        return True
    module, _, short = name.rpartition(".")
    module = f"keras_attn.{module}" if module else "keras_attn"
    for group in re.findall(rf"\bfrom {re.escape(module)} import \(?([\w, \n]+)", text):
        if short in {imported.strip() for imported in group.split(",")}:
            return True
    distinctive = "." in name or name[0].isupper()
    return distinctive and re.search(rf"(?<![\w.]){re.escape(name)}\b", text) is not None


def guides_naming(names):
    """`{public name: [(title, docs-relative path)]}`: the guides and model cards that use each of
    `names`, in the navigation's folder order."""
    naming = {}
    for folder in GUIDE_FOLDERS:
        for guide in sorted((REPO_ROOT / "docs" / folder).glob("*.md")):
            text = guide.read_text(encoding="utf-8")
            title = re.search(r"(?m)^# (.+)$", text).group(1).replace("`", "")
            for name in names:
                if named_in(text, name):
                    naming.setdefault(name, []).append((title, f"{folder}/{guide.name}"))
    return naming


def related_guides(name, naming):
    """The guides of `name` (`guides_naming`), or, when no guide uses it, those of the other names
    of its API section (`causal_mask`: the guides of the kernels and ops)."""
    if naming.get(name):
        return naming[name]
    section = next(names for names in api_pages.SECTIONS.values() if name in names)
    return list(dict.fromkeys(guide for other in section for guide in naming.get(other, [])))


def with_guides(markdown, page_uri, guides):
    """An API page's `markdown` followed by a "Guides" list linking each of `guides`."""
    here = posixpath.dirname(page_uri)
    links = [f"- [{title}]({posixpath.relpath(path, here)})" for title, path in guides]
    return "\n".join([markdown.rstrip("\n"), "", "## Guides", "", *links, ""])


def with_api_links(markdown, page_uri, naming):
    """A guide's `markdown` followed by an "API reference" line linking every public name it uses."""
    used = [name for name, guides in naming.items() if any(path == page_uri for _, path in guides)]
    if not used:
        return markdown
    links = ", ".join(f"[`keras_attn.{name}`][keras_attn.{name}]" for name in used)
    return "\n".join(
        [markdown.rstrip("\n"), "", "## API reference", "", f"The public names this page uses: {links}.", ""]
    )


_naming = {}  # guides_naming() of the build under way (on_pre_build): read once, not once per page


def on_pre_build(config):
    _naming.clear()
    _naming.update(guides_naming(api_pages.public_names()))


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    naming = _naming
    if uri.startswith("api/") and markdown.startswith("::: "):
        markdown = with_guides(markdown, uri, related_guides(markdown.split()[1].removeprefix("keras_attn."), naming))
    elif uri.split("/")[0] in GUIDE_FOLDERS:
        markdown = with_api_links(markdown, uri, naming)
    return linked(markdown, identifiers())
