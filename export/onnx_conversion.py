"""Conversion to ONNX as every model's export does it: tf2onnx, at the project's one opset.

`OPSET` is also the opset the tests convert the attention layers at, so what they prove
convertible is what the exports use.
"""

from appkit.logs import TF_TABLE_INITIALIZER
from appkit.logs import dropping_log_messages

OPSET = 18


def convert(function, path, **options):
    """Converts `function` (a `tf.function` with an input signature) into the ONNX model file `path`;
    `options` go to `tf2onnx.convert.from_function` (e.g. `custom_op_handlers`)."""
    import tf2onnx  # the `export` extra

    with dropping_log_messages(*TF_TABLE_INITIALIZER):
        tf2onnx.convert.from_function(
            function, input_signature=function.input_signature, opset=OPSET, output_path=str(path), **options
        )
