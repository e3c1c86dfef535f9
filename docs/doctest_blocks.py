"""Griffe extension: the docstrings' doctest examples (`>>>` lines and their output) become fenced
`python` code that runs as copied: the prompts removed, each expected output a `# ` comment under
its line, and the imports the example needs written first (the doctest reads them from its
module's globals, a reader copying the example has none).

An import comes from what the module itself imports or defines, by its public path when it has one
(`from keras_attn import MultiHeadAttention`, not the module it is defined in). A docstring's later
examples follow on from its earlier ones (the doctest runs them in one namespace), so only the
names they do not define get an import. The docstrings stay plain doctests (pytest runs them with
`--doctest-modules`); `tests/test_docs_site.py` runs every rendered example as it is written.
"""

import ast
import builtins
import re

import griffe

_DOCTEST_RUN = re.compile(r"(?m)^([ \t]*)>>> .*(?:\n\1(?!\s*$).*)*")
_PROMPT = re.compile(r"^(?:>>>|\.\.\.)(?: |$)")
_DIRECTIVE = re.compile(r"\s*# doctest:.*$")


def example_code(run):
    """The code of one doctest run (its lines without indentation), its outputs as comments."""
    lines = []
    for line in run.splitlines():
        if _PROMPT.match(line):
            lines.append(_DIRECTIVE.sub("", line[4:]))
        else:
            lines.append(f"# {line}")
    return "\n".join(lines)


def assigned_and_loaded(code):
    """`(names the code binds, names it reads)`, the builtins left out."""
    bound, loaded = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, loaded - set(dir(builtins))


def import_line(name, target, public_paths):
    """The statement that binds `name` to the object at the dotted path `target`."""
    target = public_paths.get(target, target)
    module, _, attribute = target.rpartition(".")
    if not module:
        return f"import {target}" if name == target else f"import {target} as {name}"
    if attribute == name:
        return f"from {module} import {name}"
    return f"import {target} as {name}"


def imports_for(names, module, public_paths):
    """The import statements binding `names` as `module`'s globals bind them (a name the module
    neither imports nor defines is left out: running the example then fails, in the test)."""
    lines = set()
    for name in names:
        if name in module.imports:
            lines.add(import_line(name, module.imports[name], public_paths))
        elif name in module.members:
            lines.add(import_line(name, f"{module.path}.{name}", public_paths))
    plain = sorted(line for line in lines if line.startswith("import "))
    return plain + sorted(lines - set(plain))


def runnable_examples(text, module, public_paths):
    """`text` with each doctest run replaced by a fenced ```python block that runs as written."""
    defined = set()

    def fence(match):
        indent = match.group(1)
        code = example_code(re.sub(rf"(?m)^{indent}", "", match.group(0)))
        bound, loaded = assigned_and_loaded(code)
        header = imports_for(loaded - defined, module, public_paths)
        defined.update(bound | loaded)
        body = "\n\n".join(part for part in ("\n".join(header), code) if part)
        block = f"```python\n{body}\n```"
        return "\n".join(f"{indent}{line}" if line else line for line in block.splitlines())

    return _DOCTEST_RUN.sub(fence, text)


def public_paths(package):
    """`{defining path: public path}` of every public name of `package` (`keras_attn.X`, `keras_attn.visualization.X`)."""
    paths = {}
    for module in (package, package["visualization"]):
        for name in module.exports or ():
            member = module.members.get(name)
            if member is not None and member.is_alias:
                paths[member.target_path] = f"{module.path}.{name}"
    return paths


class DoctestBlocks(griffe.Extension):
    def __init__(self):
        super().__init__()
        self.public = None

    def on_package(self, *, pkg, **kwargs):
        self.public = public_paths(pkg)
        for obj in _objects(pkg):
            if obj.docstring is not None and ">>>" in obj.docstring.value:
                obj.docstring.value = runnable_examples(obj.docstring.value, obj.module, self.public)


def _objects(obj):
    """`obj` and every module, class and function it defines, at any depth (aliases left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)
