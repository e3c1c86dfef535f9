"""The ```python blocks of a Markdown page, each named after the section it sits in, to run one test each."""

import ast
import builtins
import copy
import io
import re
import sys
import tokenize

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


def is_setup(name):
    """Whether the block named `name` (by `python_examples`) sits in a section whose heading starts
    with "Setup": it writes what the page's other blocks read (files in the working directory), as
    a reader runs it first."""
    return name.startswith("setup")


def expected_prints(code):
    """`{(first line, last line): text}`: the output each `print(...)  # text` call of `code` claims
    (the comment on the call's last line)."""
    comments = {
        token.start[0]: token.string[1:]
        for token in tokenize.generate_tokens(io.StringIO(code).readline)
        if token.type == tokenize.COMMENT
    }
    return {
        (node.lineno, node.end_lineno): comments[node.end_lineno]
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and _callee(node) == "print" and node.end_lineno in comments
    }


def run_example(code, page):
    """Runs one example as a fresh module would, its errors pointing into `page`; a `print` whose
    line ends with a comment must print what the comment says (whitespace aside)."""
    claims, wrong = expected_prints(code), []

    def checked_print(*args, **kwargs):
        printed = io.StringIO()
        builtins.print(*args, **{**kwargs, "file": printed})
        builtins.print(printed.getvalue(), end="")
        line = sys._getframe(1).f_lineno
        for (first, last), claim in claims.items():
            if first <= line <= last and printed.getvalue().split() != claim.split():
                wrong.append(
                    f"{page}:{first}: prints {printed.getvalue().strip()!r}, its comment says {claim.strip()!r}"
                )

    exec(compile(code, str(page), "exec"), {"__name__": "markdown_example", "print": checked_print})
    assert not wrong, "\n".join(wrong)


_RETURNS_ITS_ARGUMENT = {"convert"}  # `keras_attn.convert(model)` converts in place and returns `model`
_ASSERTIONS = {"assert_allclose", "assert_array_equal", "assert_equal", "assert_array_almost_equal", "assertEqual"}


def _callee(call):
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)


def self_comparisons(code):
    """The lines of `code` whose assertion compares a thing with itself (an `==` or `assert_allclose`
    that cannot fail): the same expression on both sides, once the names bound to the same object
    (`b = a`, `b = keras_attn.convert(a)`) are one."""
    tree = ast.parse(code)
    same = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Tuple)
                and isinstance(value, ast.Call)
                and _callee(value) in _RETURNS_ITS_ARGUMENT
            ):
                target = target.elts[0]  # `fast, report = convert(model, return_report=True)`
            if isinstance(value, ast.Call) and _callee(value) in _RETURNS_ITS_ARGUMENT and value.args:
                value = value.args[0]
            if isinstance(target, ast.Name) and isinstance(value, ast.Name):
                same[target.id] = same.get(value.id, value.id)

    class Canonical(ast.NodeTransformer):
        def visit_Name(self, node):
            return ast.Name(id=same.get(node.id, node.id), ctx=ast.Load())

    def canonical(node):
        return ast.dump(Canonical().visit(copy.deepcopy(node)))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node) in _ASSERTIONS and len(node.args) >= 2:
            pair = node.args[:2]
        elif (
            isinstance(node, ast.Assert)
            and isinstance(node.test, ast.Compare)
            and not isinstance(node.test.ops[0], (ast.Is, ast.IsNot))  # `is` asserts the sameness on purpose
            and len(node.test.comparators) == 1
        ):
            pair = [node.test.left, node.test.comparators[0]]
        else:
            continue
        if canonical(pair[0]) == canonical(pair[1]):
            lines.append(node.lineno)
    return lines
