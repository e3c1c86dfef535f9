"""Serving a SavedModel the way a server would: in a fresh interpreter with no project code.

`serve_in_fresh_process` runs a signature (`serving_default` unless told) in a new Python process (isolated
mode, its working directory a scratch folder, no `PYTHONPATH`) that imports TensorFlow only, and
fails if any project module got imported there: an export that needs our code to load is not
servable. Both models' verifications use it; any failure is an `ExportVerificationError`.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_PACKAGES = ("keras_attn", "appkit", "models", "pipelines", "export")

_SERVE_SCRIPT = """
import json, sys
import tensorflow as tf
saved_model_dir, inputs_path, outputs_path, project_packages, signature = sys.argv[1:6]
with open(inputs_path, encoding="utf-8") as file:
    inputs = json.load(file)
serve = tf.saved_model.load(saved_model_dir).signatures[signature]
outputs = serve(**{name: tf.constant(values, tf.string) for name, values in inputs.items()})
def plain(tensor):
    return [value.decode("utf-8") if isinstance(value, bytes) else value for value in tensor.numpy().tolist()]
imported = sorted(name for name in sys.modules if name.split(".")[0] in project_packages.split(","))
with open(outputs_path, "w", encoding="utf-8") as file:
    json.dump({"outputs": {name: plain(tensor) for name, tensor in outputs.items()}, "project_modules": imported}, file)
"""


class ExportVerificationError(RuntimeError):
    """An export disagrees with the Keras model (or could not be run); nothing was published."""


def serve_in_fresh_process(saved_model_dir, inputs, signature="serving_default"):
    """`{output name: list}` of `signature` on `inputs` (`{input name: list of str}`).

    Raises:
        ExportVerificationError: the process failed, or it imported project code.
    """
    with tempfile.TemporaryDirectory() as scratch:
        inputs_path, outputs_path = Path(scratch) / "inputs.json", Path(scratch) / "outputs.json"
        inputs_path.write_text(json.dumps(inputs, ensure_ascii=False), encoding="utf-8")
        environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        command = [
            sys.executable,
            "-I",
            "-c",
            _SERVE_SCRIPT,
            str(Path(saved_model_dir).resolve()),
            str(inputs_path),
            str(outputs_path),
            ",".join(PROJECT_PACKAGES),
            signature,
        ]
        result = subprocess.run(command, cwd=scratch, env=environment, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ExportVerificationError(
                f"Reloading the SavedModel in a fresh process failed:\n{result.stderr[-4000:]}"
            )
        payload = json.loads(outputs_path.read_text(encoding="utf-8"))
    if payload["project_modules"]:
        raise ExportVerificationError(f"The fresh process imported project code: {payload['project_modules']}")
    return payload["outputs"]
