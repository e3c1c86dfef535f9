"""Griffe extension: the docstrings' doctest examples (`>>>` lines and their output) become fenced
`pycon` code blocks, so the reference site shows them as code rather than Markdown quotes.

The docstrings stay plain doctests (pytest runs them with `--doctest-modules`).
"""

import re

import griffe

_DOCTEST_RUN = re.compile(r"(?m)^([ \t]*)>>> .*(?:\n\1(?!\s*$).*)*")


def fenced_doctests(text):
    """`text` with each run of doctest lines (a `>>>` line up to the next blank line) fenced as
    ```pycon (checked on the built site by tests/test_docs_site.py)."""

    def fence(match):
        indent = match.group(1)
        return f"{indent}```pycon\n{match.group(0)}\n{indent}```"

    return _DOCTEST_RUN.sub(fence, text)


class DoctestBlocks(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fenced_doctests(obj.docstring.value)
