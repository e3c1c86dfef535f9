"""Files written whole or not at all, and reads that fail in one clear line: the I/O every app shares
(`models`, `pipelines`, `export`, `benchmarks`).

A reader never sees a half-written file: text goes to a uniquely named temporary file beside the
target (so concurrent writers never share one) and is renamed over it.
"""

import contextlib
import json
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def replacing(path, suffix=".tmp"):
    """Yields a unique temporary path beside `path` (ending in `suffix`) to write; renamed over
    `path` when the block ends, removed if it raises (never a half-written `path`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(handle)
    try:
        yield Path(temporary)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; a model server may run as another user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_text_atomic(path, text):
    """Writes UTF-8 `text` to `path` through a unique temporary file and a rename (never half-written)."""
    with replacing(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path, payload):
    """Writes `payload` as indented JSON with `write_text_atomic`."""
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def reading(path, recovery):
    """Turns a missing, unreadable or corrupt file read in the block (raw h5py, JSON or Keras
    errors) into one `ValueError` naming `path` and what to do (`recovery`).

    >>> with reading("run/summary.json", "train again"):
    ...     json.loads("{")
    Traceback (most recent call last):
    ...
    ValueError: run/summary.json is unreadable or corrupt (JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); train again
    """
    try:
        yield
    except (OSError, ValueError, KeyError) as error:
        detail = " ".join(str(error).split())[:300]
        raise ValueError(f"{path} is unreadable or corrupt ({type(error).__name__}: {detail}); {recovery}") from error
