"""keras_attn runs on Keras's TensorFlow backend only: under another, `import keras_attn` raises
an `ImportError` naming the backend received and how to choose TensorFlow (keras_attn/backend.py).

The import runs in a fresh interpreter. JAX and PyTorch are not installed beside the tests, and
Keras's NumPy backend needs SciPy: with `KERAS_BACKEND=jax` Keras itself would fail at its own
import before keras_attn's check. So the child loads Keras on TensorFlow, then sets Keras's
backend setting (`keras.src.backend.config._BACKEND`, what `KERAS_BACKEND` sets and
`keras.backend.backend()` returns) to "jax" before importing keras_attn: the check reads the
setting, as it would under an installed JAX.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _import_keras_attn_under(backend):
    child = (
        "import keras\n"
        "from keras.src.backend import config\n"
        f"config._BACKEND = {backend!r}\n"
        "assert keras.backend.backend() == " + repr(backend) + "\n"
        "import keras_attn\n"
    )
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, cwd=REPO_ROOT, env=environment, timeout=300
    )


def test_importing_under_another_backend_names_it_and_how_to_choose_tensorflow():
    result = _import_keras_attn_under("jax")
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: keras_attn runs on Keras's TensorFlow backend only"), result.stderr
    assert "Received: backend='jax'" in last_line
    assert "KERAS_BACKEND=tensorflow" in last_line
