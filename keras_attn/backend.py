"""The one Keras backend keras_attn runs on: TensorFlow.

The kernels, masks and position biases are TensorFlow ops (`tf.while_loop`, `tf.scan`, ragged
and sparse tensors, run-time assertions), so under Keras's JAX, PyTorch, NumPy or OpenVINO backend a
layer would fail somewhere inside its first call, far from the cause. Importing this module
checks, and `keras_attn/__init__.py` imports it first: the error comes at `import keras_attn`,
before any of TensorFlow's ops are imported and any model is built, whichever entry point (a layer,
`convert`, `scaled_dot_product_attention`, `tune`) the user would reach first.
"""

import keras

SUPPORTED_BACKEND = "tensorflow"


def require_tensorflow_backend():
    """Raises an `ImportError` naming Keras's backend unless it is TensorFlow, and how to choose it."""
    backend = keras.backend.backend()
    if backend != SUPPORTED_BACKEND:
        raise ImportError(
            "keras_attn runs on Keras's TensorFlow backend only: its kernels are TensorFlow ops. "
            f"Received: backend={backend!r} (keras.backend.backend()). Set the environment variable "
            f'KERAS_BACKEND={SUPPORTED_BACKEND} before Python starts (or "backend": "{SUPPORTED_BACKEND}" '
            "in ~/.keras/keras.json)."
        )


require_tensorflow_backend()
