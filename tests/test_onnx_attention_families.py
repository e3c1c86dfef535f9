"""ONNX export of models using LSH, Linformer and linear (elu+1, FAVOR+) attention, run with onnxruntime.

Converted as the project converts (`tf2onnx`, `export.onnx_conversion.OPSET`), with a dynamic batch
and length; the ONNX outputs must equal Keras's on padded batches of lengths that are not a
multiple of the chunk size (the internal padding is then taken).
"""

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf
import tf2onnx

from export.onnx_conversion import OPSET
from keras_attn import LinearAttention
from keras_attn import LinformerSelfAttention
from keras_attn import LSHSelfAttention
from tests.layer_checks import padded_token_ids

ATOL = 1e-5  # float32 on both sides; measured differences are about 1e-8
COMMON = dict(num_heads=2, key_dim=4, bias_initializer="random_normal", seed=1)
FAMILIES = {
    "lsh": lambda: LSHSelfAttention(num_buckets=4, num_hashes=2, chunk_size=3, **COMMON),
    "lsh_causal": lambda: LSHSelfAttention(num_buckets=4, num_hashes=2, chunk_size=3, causal=True, **COMMON),
    "linformer": lambda: LinformerSelfAttention(max_length=32, projected_length=5, **COMMON),
    "linear_elu": lambda: LinearAttention(**COMMON),
    "linear_elu_causal": lambda: LinearAttention(causal=True, chunk_size=4, **COMMON),
    "favor": lambda: LinearAttention(feature_map="favor", **COMMON),
    "favor_causal": lambda: LinearAttention(feature_map="favor", causal=True, chunk_size=4, **COMMON),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_onnx_export_equals_keras(family, tmp_path):
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 8, mask_zero=True)(ids)
    model = keras.Model(ids, FAMILIES[family]()(embedded))
    signature = [tf.TensorSpec([None, None], tf.int32, name="token_ids")]
    predict = tf.function(lambda token_ids: model(token_ids, training=False), input_signature=signature)
    path = tmp_path / "model.onnx"
    tf2onnx.convert.from_function(predict, input_signature=signature, opset=OPSET, output_path=str(path))
    assert max(op.version for op in onnx.load(path).opset_import if op.domain in ("", "ai.onnx")) <= 18
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for lengths, width in (([11, 7, 1], 11), ([5], 5)):  # padding, and a second batch and length
        tokens = padded_token_ids(rng, lengths, width, 30)
        (got,) = session.run(None, {"token_ids": tokens})
        np.testing.assert_allclose(got, model(tokens, training=False), atol=ATOL, err_msg=f"lengths {lengths}")
