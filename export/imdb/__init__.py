"""The IMDB classifier's exports, verified before they are published.

`verified_export.export_and_verify` (what the main job calls) writes the raw-string serving
SavedModel (`savedmodel`) and the token-id ONNX bundle (`onnx_bundle`: a float and an int8 model; it ships
`onnx_predictor.py`), checks both against Keras and publishes them in TF Serving's layout.
"""
