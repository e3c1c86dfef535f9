"""Griffe extension: a layer's "Call arguments" section (Keras's docstring convention, on the class)
becomes the docstring of the layer's own `call` method, as an `Args:` section (with the `Returns:`
section that follows it), so the reference site shows `call`'s signature with each call argument
in its own row, typed and defaulted from the signature, instead of one run-on paragraph.

The docstrings stay as they are in the source (where `help(layer)` shows them, the Keras way).
"""

import re

import griffe

_ENTRIES = r"(?:[ \t]+\S.*\n|[ \t]*\n(?=[ \t]+\S))+"  # indented lines, blank lines inside
_CALL_SECTION = re.compile(
    rf"(?m)^Call arguments(?P<note> \([^)]*\))?:[ \t]*\n(?P<arguments>{_ENTRIES})"
    rf"(?:[ \t]*\n)*(?:Returns:[ \t]*\n(?P<returns>{_ENTRIES}))?"
)
POINTER = "Call arguments: see `call` below.\n"


def call_docstring(class_docstring):
    """`(class docstring without its call sections, call docstring)`; `call docstring` is `None`
    when the class documents no call arguments as an indented section."""
    match = _CALL_SECTION.search(class_docstring + "\n")
    if match is None:
        return class_docstring, None
    note = " ".join(match["note"].strip()[1:-1].split()) if match["note"] else ""
    parts = [f"{note[:1].upper()}{note[1:]}.\n" if note else "", f"Args:\n{match['arguments']}"]
    if match["returns"]:
        parts.append(f"Returns:\n{match['returns']}")
    remaining = class_docstring[: match.start()] + POINTER + class_docstring[match.end() :]
    return remaining.rstrip("\n"), "\n".join(part for part in parts if part).rstrip("\n")


class CallArguments(griffe.Extension):
    def on_class(self, *, cls, **kwargs):
        call = cls.members.get("call")
        if cls.docstring is None or call is None or call.is_alias or call.docstring is not None:
            return  # an inherited or self-documented `call` keeps the class text as it is
        remaining, moved = call_docstring(cls.docstring.value)
        if moved is not None:
            cls.docstring.value = remaining
            call.docstring = griffe.Docstring(
                moved, parent=call, parser=cls.docstring.parser, parser_options=cls.docstring.parser_options
            )
