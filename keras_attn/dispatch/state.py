"""The dispatcher's state on disk: the user's cache directory and the JSON files in it.

Two files live there: the calibration `keras_attn.tune()` fits (`keras_attn.dispatch.cost_model`)
and the kernel times `implementation="auto"` measured (`keras_attn.dispatch.measuring`). Neither may
ever break a model:

- a file is written whole or not at all: a temporary file in the same directory, flushed to disk
  (`fsync`), then renamed over the old one (`os.replace`), under an exclusive lock on a lock file
  beside it (`fcntl.flock`; no lock where `fcntl` is absent), so that processes writing at once
  each merge into the latest file and a process killed mid-write leaves the previous file;
- a file read back is used only when it parses, is of this format (`FORMAT_VERSION`) and of this
  environment (`environment()`: TensorFlow, Keras and keras-attn versions, and the device), and its
  values pass the reader's check; else it is ignored with one warning naming its path (once per
  path and process) and the dispatcher falls back to the shipped calibration or a fresh measurement.
"""

import contextlib
import functools
import json
import math
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

CACHE_ENV = "KERAS_ATTN_CACHE"
FORMAT_VERSION = 2  # of the files written here; the shipped calibration is read without this check
# Seconds a writer sleeps between its complete temporary file and the rename: only for the tests
# that kill a writer there (the file in place must stay readable).
WRITE_DELAY_ENV = "KERAS_ATTN_TEST_WRITE_DELAY"

_warned = set()  # paths already warned about in this process


def cache_dir():
    """The user's keras_attn cache directory: `$KERAS_ATTN_CACHE`, else `~/.cache/keras_attn`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "keras_attn")


def unwritable_reason(directory):
    """Why no file can be written in `directory` (created if missing), or `None` when one can:
    checked by writing and removing a probe file (permissions alone do not tell, e.g. for root)."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


@functools.lru_cache(maxsize=1)
def environment():
    """What a measured time or a fitted calibration is valid for besides the call: the versions of
    TensorFlow, Keras and keras-attn, and the device the kernels run on."""
    import keras
    import tensorflow as tf

    from keras_attn.version import __version__

    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_attn": __version__,
        "device": _device(),
    }


def _device():
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return f"GPU {details.get('device_name', gpus[0].name)} x{len(gpus)}"
    return f"CPU {platform.machine()} {platform.processor()} x{os.cpu_count()}".replace("  ", " ")


def envelope(payload):
    """`payload` with this format's version and this environment, as every file here is written."""
    return {"format": FORMAT_VERSION, "environment": environment(), **payload}


def read(path, check):
    """The JSON payload at `path` when it is whole, of this format and environment, and
    `check(payload)` returns `None` (else a reason); else `None`, with one warning naming the path.
    A missing file is `None` without a warning."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        return _ignored(path, f"unreadable ({error})")
    try:
        payload = json.loads(text)
    except ValueError as error:
        return _ignored(path, f"not valid JSON, truncated or corrupt ({error})")
    reason = _envelope_problem(payload) or check(payload)
    return _ignored(path, reason) if reason else payload


def _envelope_problem(payload):
    if not isinstance(payload, dict):
        return f"not a JSON object (a {type(payload).__name__})"
    if payload.get("format") != FORMAT_VERSION:
        return f"of format {payload.get('format')!r}, not {FORMAT_VERSION}"
    if payload.get("environment") != environment():
        return f"written for {payload.get('environment')!r}, not this {environment()!r}"
    return None


def _ignored(path, reason):
    if str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(
            f"keras_attn ignores {path}: {reason}. The shipped calibration or a new measurement is used instead.",
            stacklevel=3,
        )
    return None


def nonnegative_number_problem(where, value):
    """Why `value` (at `where` in a file) is not a finite number >= 0, or `None`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return f"{where} is {value!r}, not a finite number >= 0"
    return None


def update(path, check, merge):
    """Replaces the file at `path` by `envelope(merge(current))` atomically under its lock, where
    `current` is the payload in place as `read(path, check)` returns it (`None` when missing or
    ignored). Returns the path."""
    path = Path(path)
    os.makedirs(path.parent, exist_ok=True)
    with _locked(path):
        current = read(path, check)
        _write_atomically(path, json.dumps(envelope(merge(current)), indent=1, sort_keys=True))
    return path


@contextlib.contextmanager
def _locked(path):
    """An exclusive lock on `path`'s lock file for the block (none where `fcntl` is absent)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic replacement alone; a concurrent writer's entries may be lost
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomically(path, text):
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        delay = float(os.environ.get(WRITE_DELAY_ENV) or 0)
        if delay:
            time.sleep(delay)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself reaches the disk (POSIX directories)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
