"""The translator's exports, verified before they are published: `python -m export.translator`.

`verified_export.export_translator` writes the raw-string serving SavedModel (`savedmodel`) and
the encoder and decoder-step ONNX graphs (`onnx_graphs`) into one version, checks both against
Keras and publishes it in TF Serving's layout.
"""
