"""Which tests are the library's own: `pytest --library-only` (`make test-compat`) runs only those.

A module under `tests/` belongs to the library when what it imports at module level, followed
through the tests' own helper modules, names none of `APP_MODULES` (the repository's apps and the
optional dependencies a bare `pip install keras-attn` lacks, which importing the library never loads:
tests/test_distribution.py); in such a module a test whose own
body imports one of them is an app test too. Read with `ast`, before anything is imported, so a new
test of `keras_attn` alone is selected without a list to keep up to date, and an app test never
breaks the collection in an environment without the apps' dependencies.

`--importable NAME` (repeatable) names app modules an environment has all the same: the tests that
need only those besides the library join the selection. `make test-compat` installs the oldest
KerasHub and passes `keras_hub` and `models.keras_io_examples` (plain Keras), so the tests of
`keras_attn.convert` run there too. A package holding a named module counts as importable with it.
"""

import ast
import inspect
import textwrap
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
APP_MODULES = frozenset(
    {
        "appkit",
        "docs",  # the site's generators: they import mkdocs (the `docs` extra)
        "mkdocs",
        "models",
        "pipelines",
        "export",
        "benchmarks",
        "onnx",
        "tf2onnx",
        "onnxruntime",
        "tensorflow_datasets",
        "tensorflow_serving",
        "matplotlib",
        "sacrebleu",
        "playwright",
        "keras_hub",
    }
)


def _imported_names(nodes):
    """The full module names the import statements among `nodes` name (`from a import b`: `a` and `a.b`)."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_app_module(name, importable):
    """Whether the module `name` is one of `APP_MODULES` or inside one, and neither one of the
    `importable` names, inside one, nor a package holding one."""
    if name.split(".")[0] not in APP_MODULES:
        return False
    return not any(
        name == other or name.startswith(f"{other}.") or other.startswith(f"{name}.") for other in importable
    )


def _module_level_nodes(tree):
    """Every node outside function bodies (class bodies included: they run on import)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _helper_path(name):
    """`tests/<x>.py` for the module name `tests.<x>`, else `None`."""
    parts = name.split(".")
    if len(parts) == 2 and parts[0] == "tests" and (TESTS_DIR / f"{parts[1]}.py").is_file():
        return TESTS_DIR / f"{parts[1]}.py"
    return None


def reaches_apps(path, importable=(), module_level_only=True, _seen=None):
    """Whether the module at `path` imports an app module (not `importable`), directly or through a
    tests helper (a helper counts with the imports inside its functions too)."""
    seen = set() if _seen is None else _seen
    if path in seen:
        return False
    seen.add(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = _imported_names(_module_level_nodes(tree) if module_level_only else ast.walk(tree))
    if any(_is_app_module(name, importable) for name in names):
        return True
    helpers = {_helper_path(name) for name in names} - {None}
    return any(reaches_apps(helper, importable, module_level_only=False, _seen=seen) for helper in helpers)


def is_library_path(path, importable=()):
    """Whether `pytest --library-only` collects `path`: the `keras_attn` package (its doctests), and
    the modules of `tests/` that reach no app module at module level but the `importable` ones."""
    path = Path(path).resolve()
    if path.is_dir():
        return path == REPO_ROOT or path.is_relative_to(TESTS_DIR) or path.is_relative_to(REPO_ROOT / "keras_attn")
    if path.is_relative_to(REPO_ROOT / "keras_attn"):
        return True
    if path.is_relative_to(TESTS_DIR) and path.suffix == ".py":
        return not reaches_apps(path, importable)
    return False


def is_library_test(function, importable=()):
    """Whether a test function of a library module imports no app module but the `importable` ones
    in its own body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return not any(_is_app_module(name, importable) for name in _imported_names(ast.walk(tree)))
