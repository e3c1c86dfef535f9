"""ONNX export of per-document pooling (packed rows: segment ids in, one vector per document out), run
with onnxruntime against the Keras model, as the project converts (`tf2onnx`, `export.onnx_conversion.OPSET`)."""

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf
import tf2onnx

from export.onnx_conversion import OPSET
from keras_attn import AttentionPooling
from keras_attn import MaskedGlobalPooling
from tests.packed_rows import packed_rows

POOLINGS = {
    "mean": lambda: MaskedGlobalPooling("mean", max_documents=4),
    "max": lambda: MaskedGlobalPooling("max", max_documents=4),
    "attention": lambda: AttentionPooling(num_heads=2, key_dim=4, max_documents=4),
}


@pytest.mark.parametrize("pooling", sorted(POOLINGS))
def test_per_document_pooling_exports_to_onnx_with_parity(pooling, tmp_path):
    vectors, segment_ids = keras.Input((None, 6)), keras.Input((None,), dtype="int32")
    model = keras.Model([vectors, segment_ids], POOLINGS[pooling]()(vectors, segment_ids=segment_ids))
    signature = [
        tf.TensorSpec([None, None, 6], tf.float32, name="vectors"),
        tf.TensorSpec([None, None], tf.int32, name="segment_ids"),
    ]
    predict = tf.function(lambda v, s: model([v, s], training=False), input_signature=signature)
    path = tmp_path / "model.onnx"
    tf2onnx.convert.from_function(predict, input_signature=signature, opset=OPSET, output_path=str(path))
    assert max(op.version for op in onnx.load(path).opset_import if op.domain in ("", "ai.onnx")) <= 18
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for lengths, width in ((((3, 1, 2), (6,), (), (2, 2, 2, 1)), 9), (((4,),), 5)):  # a second batch and length
        values, ids, _ = packed_rows(rng, lengths, width, 6)
        (got,) = session.run(None, {"vectors": values, "segment_ids": ids})
        np.testing.assert_allclose(got, model([values, ids], training=False), atol=1e-5, err_msg=f"lengths {lengths}")
