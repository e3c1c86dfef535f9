"""Reads a TF Serving layout back with TF Serving's own protos (the oracle for both models' exports)."""

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2


def warmup_requests(version_dir, input_name):
    """`[(model name, signature name, [strings])]`, one per record of the version's warmup file."""
    records = version_dir / "assets.extra" / "tf_serving_warmup_requests"
    requests = []
    for record in tf.data.TFRecordDataset(str(records)).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        strings = [value.decode("utf-8") for value in tf.make_ndarray(request.inputs[input_name]).tolist()]
        requests.append((request.model_spec.name, request.model_spec.signature_name, strings))
    return requests
