"""TF Serving's directory layout, published atomically; no model-specific code.

    <export_dir>/models.config
    <export_dir>/<model_name>/<version>/saved_model.pb
                                       variables/
                                       assets.extra/tf_serving_warmup_requests

A version is built in a hidden staging directory beside its final place (`.staging-*`, which
TF Serving ignores), checked by the caller, and only then renamed to `<version>`: a server
watching the directory never sees a half-written model, and an existing version is never
overwritten (the next free number is taken). `models.config` is replaced whole, never written
in place.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import tensorflow as tf

from models.files import write_text_atomic

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
SIGNATURE = "serving_default"


def existing_versions(model_dir):
    """The numeric version directories already published under `model_dir`."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(entry.name) for entry in model_dir.iterdir() if entry.name.isdigit() and entry.is_dir())


def publish(staging, model_dir):
    """Renames `staging` to `model_dir/<next free version>` and returns that path."""
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
def staging_directory(model_dir):
    """A fresh hidden directory inside `model_dir`, removed if the block raises."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=model_dir))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a model server may run as another user
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_warmup_requests(path, model_name, input_name, batches):
    """Writes `assets.extra/tf_serving_warmup_requests` under the SavedModel at `path`.

    One `PredictionLog` per batch of strings (`input_name` of the `serving_default` signature),
    built with the `tensorflow-serving-api` protos, so the server runs the graph before taking
    traffic.
    """
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
    """Writes `<export_dir>/models.config` listing every model directory with a published version."""
    export_dir = Path(export_dir).resolve()
    entries = []
    for model_dir in sorted(path for path in export_dir.iterdir() if path.is_dir()):
        if existing_versions(model_dir):
            entries.append(
                "  config {\n"
                f'    name: "{model_dir.name}"\n'
                f'    base_path: "{model_dir}"\n'
                '    model_platform: "tensorflow"\n'
                "  }\n"
            )
    return write_text_atomic(export_dir / "models.config", "model_config_list {\n" + "".join(entries) + "}\n")
