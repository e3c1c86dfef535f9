"""Conversion to ONNX as every model's export does it: tf2onnx, at the project's one opset.

`OPSET` is also the opset the tests convert the attention layers at, so what they prove
convertible is what the exports use.
"""

from appkit.logs import TF_TABLE_INITIALIZER
from appkit.logs import dropping_log_messages
from keras_attn.layers.capabilities import AttentionCapabilities
from keras_attn.layers.capabilities import unsupported

OPSET = 18


def convert(function, path, **options):
    """Converts `function` (a `tf.function` with an input signature) into the ONNX model file `path`;
    `options` go to `tf2onnx.convert.from_function` (e.g. `custom_op_handlers`)."""
    import tf2onnx  # the `export` extra

    with dropping_log_messages(*TF_TABLE_INITIALIZER):
        tf2onnx.convert.from_function(
            function, input_signature=function.input_signature, opset=OPSET, output_path=str(path), **options
        )


def check_onnx_capable(model):
    """Raises a `ValueError` naming the family (and its declared reason) of the first attention
    layer inside `model` whose class declares `capabilities.onnx = False`."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        capabilities = getattr(type(layer), "capabilities", None)
        if isinstance(capabilities, AttentionCapabilities) and not capabilities.onnx:
            raise unsupported(layer, "onnx", f"an ONNX export of the model {model.name!r} (its layer {layer.path!r})")
