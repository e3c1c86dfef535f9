"""The ```python blocks of a Markdown page, each named after the section it sits in, to run one test each."""

import re

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def _slug(heading):
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def python_examples(page):
    """`(name, code)` for each ```python block of `page`: `name` is `<section>-<n>` (the n-th block of
    the section), `code` is preceded by blank lines so that a traceback's line numbers are the page's."""
    text = page.read_text(encoding="utf-8")
    examples, seen = [], {}
    for fence in _FENCE.finditer(text):
        if fence.group(1) != "python":
            continue
        headings = _HEADING.findall(text, 0, fence.start())
        section = _slug(headings[-1]) if headings else "top"
        seen[section] = seen.get(section, 0) + 1
        first_line = text.count("\n", 0, fence.start(2))
        examples.append((f"{section}-{seen[section]}", "\n" * first_line + fence.group(2)))
    return examples


def run_example(code, page):
    """Runs one example as a fresh module would, its errors pointing into `page`."""
    exec(compile(code, str(page), "exec"), {"__name__": "markdown_example"})
