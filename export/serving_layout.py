"""TF Serving's directory layout, published atomically; no model-specific code.

    <export_dir>/models.config
    <export_dir>/<model_name>/<version>/saved_model.pb
                                       variables/
                                       assets.extra/tf_serving_warmup_requests

A version is built in a hidden staging directory beside its final place (`.staging-*`, which
TF Serving ignores), checked by the caller, and only then renamed to `<version>`: a server
watching the directory never sees a half-written model, and an existing version is never
overwritten (the next free number is taken). Each staging directory holds an exclusive `flock`
on its `.lock` file while its exporter lives; the next export removes the staging directories whose
lock nobody holds any more (left by a killed export). `models.config` is rewritten under a lock on
`.models.config.lock` (so two publishers never drop each other's model) and replaced whole through a
unique temporary file: a reader sees the old file or the new one, never an empty or partial one.
`check_models_config` proves an export root's `models.config` is what TF Serving needs to serve
every model published there. TensorFlow is imported only by the functions that build graphs or
records, so `python -m export.verify` reads the layout without loading it.
"""

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from appkit.files import write_text_atomic
from appkit.logs import TF_TABLE_INITIALIZER
from appkit.logs import dropping_log_messages

MODELS_CONFIG = "models.config"
WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
SIGNATURE = "serving_default"
STAGING_PREFIX = ".staging-"
_STAGING_LOCK = ".lock"
_CONFIG_LOCK = ".models.config.lock"
_UNLOCKED_STALE_SECONDS = 3600
_PLATFORM = "tensorflow"


_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def one_dimensional_batch(strings):
    """`strings` once its run-time shape is `[batch]`: a loaded signature takes any rank (it does not
    enforce its `TensorSpec`), and a 2-D batch would fail deep in the graph. The error names this
    node: `Shape of tensor <input> [1,2] is not compatible with expected shape [?]`."""
    import tensorflow as tf

    return tf.ensure_shape(strings, [None], name="input_must_be_a_1d_batch_of_strings")


def check_model_name(name):
    """`name`, once it is a plain directory name for `<export_dir>/<name>` (letters, digits, `_`,
    `.`, `-`; no path separator, no `..`): anything else would publish outside the layout."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            "`model_name` must be a directory name of letters, digits, '_', '.' and '-' (not starting with "
            f"'.' or '-', no '..'). Received: model_name={name!r}"
        )
    return name


def existing_versions(model_dir):
    """The numeric version directories already published under `model_dir`."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(entry.name) for entry in model_dir.iterdir() if entry.name.isdigit() and entry.is_dir())


def publish(staging, model_dir):
    """Renames `staging` to `model_dir/<next free version>` and returns that path."""
    # The owner keeps its flock on the unlinked file until `staging_directory` closes it.
    (Path(staging) / _STAGING_LOCK).unlink(missing_ok=True)
    while True:
        version = max(existing_versions(model_dir), default=0) + 1
        target = Path(model_dir) / str(version)
        try:
            os.rename(staging, target)  # atomic; fails if `target` appeared meanwhile
            return target
        except OSError:
            if not target.exists():
                raise


@contextlib.contextmanager
def _exclusive_lock(path, blocking=True):
    """Holds `flock(LOCK_EX)` on `path` (created) for the block; yields False if not `blocking` and taken."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)  # releases the lock


def remove_stale_staging(model_dir):
    """Removes the staging directories under `model_dir` whose exporter is gone; returns them.

    A live exporter holds the lock on `<staging>/.lock`; a killed one's lock went with its process.
    A staging directory without a lock file is being renamed into place right now, unless it is
    older than `_UNLOCKED_STALE_SECONDS` (an export killed during that rename, or an older layout).
    """
    model_dir = Path(model_dir)
    removed = []
    for staging in sorted(model_dir.glob(STAGING_PREFIX + "*")) if model_dir.is_dir() else []:
        lock = staging / _STAGING_LOCK
        if not lock.is_file():
            with contextlib.suppress(FileNotFoundError):
                if time.time() - staging.stat().st_mtime > _UNLOCKED_STALE_SECONDS:
                    shutil.rmtree(staging, ignore_errors=True)
                    removed.append(staging)
            continue
        try:
            with _exclusive_lock(lock, blocking=False) as free:
                if free and lock.is_file():
                    shutil.rmtree(staging, ignore_errors=True)
                    removed.append(staging)
        except FileNotFoundError:  # published between the check and the open
            continue
    return removed


@contextlib.contextmanager
def staging_directory(model_dir):
    """A fresh hidden directory inside `model_dir`, locked while the block runs, removed if it raises.

    Stale staging directories left in `model_dir` by killed exports are removed first.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(model_dir)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=model_dir))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a model server may run as another user
    with _exclusive_lock(staging / _STAGING_LOCK):
        try:
            yield staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def write_archive(archive, path):
    """Writes the `keras.export.ExportArchive` `archive` as a SavedModel at `path`, without
    TensorFlow's harmless table-initializer warning (`appkit.logs.TF_TABLE_INITIALIZER`)."""
    with dropping_log_messages(*TF_TABLE_INITIALIZER):
        archive.write_out(str(path), verbose=False)


def write_warmup_requests(path, model_name, input_name, batches):
    """Writes `assets.extra/tf_serving_warmup_requests` under the SavedModel at `path`.

    One `PredictionLog` per batch of strings (`input_name` of the `serving_default` signature),
    built with the `tensorflow-serving-api` protos, so the server runs the graph before taking
    traffic.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    target = Path(path) / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(target)) as writer:
        for batch in batches:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=SIGNATURE)
            )
            request.inputs[input_name].CopyFrom(tf.make_tensor_proto(list(batch), dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return target


def write_models_config(export_dir):
    """Writes `<export_dir>/models.config` listing every model directory with a published version.

    Listing and writing happen under one lock, so concurrent publishers serialise: the last one
    to write lists every version published before it, its own and the others'.
    """
    export_dir = Path(export_dir).resolve()
    with _exclusive_lock(export_dir / _CONFIG_LOCK):
        return write_text_atomic(export_dir / MODELS_CONFIG, _models_config_text(export_dir))


def served_model_dirs(export_dir):
    """The model directories of `export_dir` with a published version: what `models.config` lists."""
    return sorted(path for path in Path(export_dir).iterdir() if path.is_dir() and existing_versions(path))


def _models_config_text(export_dir):
    entries = []
    for model_dir in served_model_dirs(export_dir):
        entries.append(
            "  config {\n"
            f'    name: "{model_dir.name}"\n'
            f'    base_path: "{model_dir}"\n'
            f'    model_platform: "{_PLATFORM}"\n'
            "  }\n"
        )
    return "model_config_list {\n" + "".join(entries) + "}\n"


def check_models_config(export_dir):
    """Raises a ValueError naming `<export_dir>/models.config` unless TF Serving can serve every model
    published under `export_dir` from it: the file is there, parses as TF Serving's own
    `ModelServerConfig`, and lists each published model once, under its directory's name, at its
    directory in this root (a root moved or copied elsewhere still points at the old place), on the
    `tensorflow` platform, and nothing else. Returns the names of the models listed."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    export_dir = Path(export_dir).resolve()
    path = export_dir / MODELS_CONFIG
    again = f"export a model into {export_dir} again, which rewrites it"
    if not path.is_file():
        raise ValueError(
            f"{path} is missing: TF Serving finds the models of an export root through it (--model_config_file); "
            + again
        )
    try:
        config = text_format.Parse(path.read_text(encoding="utf-8"), model_server_config_pb2.ModelServerConfig())
    except (text_format.ParseError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a TF Serving model config ({error}); {again}") from None
    published = {model_dir.name: model_dir for model_dir in served_model_dirs(export_dir)}
    listed = set()
    for entry in config.model_config_list.config:
        where = f"{path} lists model {entry.name!r}"
        if entry.name in listed:
            raise ValueError(f"{where} twice; {again}")
        listed.add(entry.name)
        if entry.name not in published:
            raise ValueError(f"{where}, which has no published version in {export_dir}; {again}")
        if Path(entry.base_path) != published[entry.name]:
            raise ValueError(
                f"{where} at base_path {entry.base_path!r}, not at {str(published[entry.name])!r} (was the root "
                f"moved or copied?); {again}"
            )
        if entry.model_platform != _PLATFORM:
            raise ValueError(f"{where} on platform {entry.model_platform!r}, expected {_PLATFORM!r}; {again}")
    unlisted = sorted(set(published) - listed)
    if unlisted:
        raise ValueError(
            f"{path} does not list {unlisted[0]!r}, published in {export_dir}: TF Serving would not serve it; {again}"
        )
    return sorted(listed)
