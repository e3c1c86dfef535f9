import atexit
import gc
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# `implementation="auto"` decides by the calibration's predictions in the suite (thousands of calls,
# reproducible); the dispatcher's own tests turn measuring on. No test writes to ~/.cache: the
# cache directory is this session's own.
os.environ.setdefault("KERAS_ATTN_MEASURE", "0")
if "KERAS_ATTN_CACHE" not in os.environ:
    os.environ["KERAS_ATTN_CACHE"] = tempfile.mkdtemp(prefix="keras_attn_cache_")
    atexit.register(shutil.rmtree, os.environ["KERAS_ATTN_CACHE"], ignore_errors=True)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests import library_selection  # noqa: E402

# The IMDB fixtures (the small archive, its cache, the session's tiny trained classifier), for every
# test module that names them as arguments.
pytest_plugins = ["tests.imdb_fixtures"]


@pytest.fixture(autouse=True)
def _float32_policy_and_seed():
    """Every test starts from float32 and fixed seeds, whatever the previous test set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test (its module fixtures finalized), collects its garbage once and
    freezes what survives: the session's long-lived objects (imports, TensorFlow's and Keras's
    global state, session fixtures).

    Keras runs a full `gc.collect()` each time a layer deletes a variable (`Model.quantize` deletes
    every kernel it replaces), and a full collection visits every tracked object: in a worker that
    has already run dozens of modules, each one costs seconds. Frozen objects are not visited, so a
    collection costs what the current module allocated. Freezing only the survivors of a collection
    at a module boundary leaves each module's own garbage to be collected as usual.
    """
    result = yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()
    return result


def pytest_addoption(parser):
    parser.addoption(
        "--library-only",
        action="store_true",
        help="only the tests of keras_attn alone, none of the apps' (tests/library_selection.py; make test-compat)",
    )
    parser.addoption(
        "--importable",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --library-only: an app module this environment has (e.g. keras_hub), whose tests join",
    )


def pytest_ignore_collect(collection_path, config):
    importable = config.getoption("--importable")
    if config.getoption("--library-only") and not library_selection.is_library_path(collection_path, importable):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    _slow_modules_first(items)
    if not config.getoption("--library-only"):
        return
    selected, deselected = [], []
    for item in items:
        function = getattr(item, "function", None)
        keep = function is None or library_selection.is_library_test(function, config.getoption("--importable"))
        (selected if keep else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def _slow_modules_first(items):
    """Puts the modules holding a `slow` test first, each module's tests in their order.

    `make test` hands whole modules to its two workers (`--dist loadfile`) in this order: with the
    longest modules handed out first, no long module is left to start when the other worker has
    nothing more to do (the run's time is bounded by its longest module, not by the order).
    """
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow") and hasattr(item, "module")}
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in slow)
