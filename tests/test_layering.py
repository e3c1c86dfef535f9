"""The project's imports only look down, and no module imports itself back through others.

    keras_attn, appkit  <-  models  <-  pipelines, export  <-  pipelines.main_job

`appkit` (CLI conventions, atomic files) imports nothing from the project; every app layer may use
it. Inside `keras_attn`, the attention stack looks down too: `keras_attn.dispatch` (the entry point
and what `"auto"` chooses) <- `keras_attn.kernels` <- `keras_attn.core` (softmax, masks, segments,
position bias): a kernel never imports the dispatcher, the core neither. `pipelines` and `export` are siblings that never import each other; only the main job, the
composition root, uses both. Imports are read with `ast` from every module (imports inside
functions included), so the rule holds for what the code does, not for what happens to run.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keras_attn", "appkit", "models", "pipelines", "export")
# What each package may import from the project, besides itself.
ALLOWED = {
    "keras_attn": set(),
    "appkit": set(),
    "models": {"keras_attn", "appkit"},
    "pipelines": {"keras_attn", "appkit", "models"},
    "export": {"keras_attn", "appkit", "models"},
}
COMPOSITION_ROOT = "pipelines.main_job"
# The attention stack inside keras_attn, top to bottom: each may import only those below it.
ATTENTION_STACK = ("keras_attn.dispatch", "keras_attn.kernels", "keras_attn.core")


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules():
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported_modules(name, path, known):
    """The project modules `name` imports (absolute or relative, anywhere in the file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:  # `from a.b import c`: c may be a name in a.b
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_graph():
    modules = project_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def layer_violations(graph):
    """`(importer, imported)` pairs that import upwards or sideways."""
    violations = []
    for importer, imported in graph.items():
        layer = importer.split(".")[0]
        for target in imported:
            target_layer = target.split(".")[0]
            allowed = target_layer == layer or target_layer in ALLOWED[layer]
            if not allowed and not (importer == COMPOSITION_ROOT and target_layer == "export"):
                violations.append((importer, target))
    return sorted(violations)


def stack_level(module):
    """The index in `ATTENTION_STACK` of the package holding `module`, or `None` outside it."""
    for level, package in enumerate(ATTENTION_STACK):
        if module == package or module.startswith(package + "."):
            return level
    return None


def stack_violations(graph):
    """`(importer, imported)` pairs of the attention stack that import upwards."""
    violations = []
    for importer, imported in graph.items():
        level = stack_level(importer)
        if level is None:
            continue
        for target in imported:
            target_level = stack_level(target)
            if target_level is not None and target_level < level:
                violations.append((importer, target))
    return sorted(violations)


def import_cycles(graph):
    """Every strongly connected group of two or more modules (Tarjan), each a sorted list."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def package_level(graph):
    """The graph with each package `__init__`'s edges to the modules inside it dropped (`a/__init__`
    re-exporting `a.b.C`, `keras_attn/kernels/__init__` registering `keras_attn.kernels.dense`)."""
    packages = {name for name, path in project_modules().items() if path.name == "__init__.py"}
    return {
        importer: {target for target in imported if not (importer in packages and target.startswith(importer + "."))}
        for importer, imported in graph.items()
    }


def test_every_package_is_scanned():
    modules = project_modules()
    for package in PACKAGES:
        assert package in modules, f"{package}/__init__.py is missing"
    assert COMPOSITION_ROOT in modules


def test_imports_only_look_down():
    assert layer_violations(import_graph()) == []


def test_the_attention_stack_only_looks_down():
    assert stack_violations(import_graph()) == []


@pytest.mark.parametrize(
    "graph, expected",
    [
        (
            {"keras_attn.kernels.dense": {"keras_attn.dispatch.cost_model"}},
            [("keras_attn.kernels.dense", "keras_attn.dispatch.cost_model")],
        ),
        (
            {"keras_attn.core.softmax": {"keras_attn.kernels.cost"}},
            [("keras_attn.core.softmax", "keras_attn.kernels.cost")],
        ),
        ({"keras_attn.core.masks": {"keras_attn.dispatch"}}, [("keras_attn.core.masks", "keras_attn.dispatch")]),
        ({"keras_attn.dispatch.attention": {"keras_attn.kernels", "keras_attn.core.softmax"}}, []),
        ({"keras_attn.layers.x": {"keras_attn.dispatch.attention"}}, []),
    ],
)
def test_stack_rule_catches_upward_imports(graph, expected):
    assert stack_violations(graph) == expected


def test_no_import_cycles():
    assert import_cycles(package_level(import_graph())) == []


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"models.a": {"pipelines.b"}, "pipelines.b": set()}, [("models.a", "pipelines.b")]),
        ({"export.a": {"pipelines.b"}, "pipelines.b": set()}, [("export.a", "pipelines.b")]),
        ({"pipelines.b": {"export.a"}, "export.a": set()}, [("pipelines.b", "export.a")]),
        ({"keras_attn.a": {"models.b"}, "models.b": set()}, [("keras_attn.a", "models.b")]),
        ({"appkit.a": {"models.b"}, "models.b": set()}, [("appkit.a", "models.b")]),
        ({"keras_attn.a": {"appkit.b"}, "appkit.b": set()}, [("keras_attn.a", "appkit.b")]),
        ({"models.a": {"appkit.b"}, "export.c": {"appkit.b"}, "appkit.b": set()}, []),
        ({"pipelines.main_job": {"export.a", "models.b"}, "export.a": set(), "models.b": set()}, []),
    ],
)
def test_layer_rule_catches_upward_and_sibling_imports(graph, expected):
    assert layer_violations(graph) == expected


def test_cycle_finder_catches_indirect_cycles():
    graph = {"keras_attn.a": {"keras_attn.b"}, "keras_attn.b": {"keras_attn.c"}, "keras_attn.c": {"keras_attn.a"}}
    assert import_cycles(graph) == [["keras_attn.a", "keras_attn.b", "keras_attn.c"]]
    assert import_cycles({"keras_attn.a": {"keras_attn.b"}, "keras_attn.b": set()}) == []


def test_function_level_and_relative_imports_are_read(tmp_path, monkeypatch):
    package = tmp_path / "models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pipelines.resumable_training import x\n    from . import b\n")
    known = {"models", "models.a", "models.b", "pipelines.resumable_training"}
    assert imported_modules("models.a", package / "a.py", known) == {
        "pipelines.resumable_training",
        "models.b",
        "models",
    }


# Keras's private tree, `keras.src`, changes between releases without notice; the library reaches it
# from this one module (`keras_attn.keras_internals`), which `tests/test_keras_internals.py` checks.
KERAS_INTERNALS_MODULE = "keras_attn.keras_internals"


def keras_private_uses(path):
    """Line numbers where the module at `path` imports or names `keras.src`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = [f"{node.value.id}.{node.attr}"]
        else:
            continue
        if any(name == "keras.src" or name.startswith("keras.src.") for name in names):
            lines.append(node.lineno)
    return lines


def test_keras_attn_reaches_no_private_keras_module():
    uses = {
        name: keras_private_uses(path)
        for name, path in project_modules().items()
        if name.split(".")[0] == "keras_attn" and name != KERAS_INTERNALS_MODULE
    }
    assert {name: lines for name, lines in uses.items() if lines} == {}


def test_private_keras_finder_sees_imports_and_attributes(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import keras\nimport keras.src.ops\nfrom keras.src import backend\nfrom keras import ops\n"
        "x = keras.src.models.Functional\ny = keras.layers.Dense\n"
    )
    assert keras_private_uses(module) == [2, 3, 5]
