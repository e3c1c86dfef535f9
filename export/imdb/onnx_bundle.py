"""ONNX export of the IMDB token-id classifier, bundled with what a client needs to tokenise.

String ops do not convert to ONNX, so the ONNX graph starts at token ids: input `token_ids`
(int32 `[batch, length]`, both dynamic, 0 = padding), output `probability` (float32
`[batch, 1]`). The bundle directory holds:

    model.onnx         tf2onnx conversion (`export.onnx_conversion`)
    model.int8.onnx    model.onnx with int8 weights: ONNX Runtime's dynamic quantisation (the
                       MatMul and Gather weights stored as int8, activations quantised at run
                       time); checked by accuracy, not parity (`verified_export.verify_int8_accuracy`)
    model.fused.onnx   model.onnx with each attention core one com.microsoft.MultiHeadAttention node
                       (`export.onnx_fused_attention`): the same parity, faster on long batches;
                       absent when the rewrite does not match the graph's attention (the families
                       other than dense attention: `write_fused_attention_model`)
    vocabulary.txt     the training vocabulary (line i = id 2 + i)
    tokenizer.json     standardisation rules, reserved ids, sequence length
    onnx_predictor.py  a NumPy + onnxruntime predictor applying them (a copy of
                       export/imdb/onnx_predictor.py; the bundle needs no project code)
    export_manifest.py the integrity check it runs first (a copy of models/export_manifest.py)
    manifest.json      SHA-256 and size of every file, model id, vocabulary size
"""

import json
import logging
import shutil
from pathlib import Path

import tensorflow as tf

import keras_attn
from appkit.logs import ORT_QUANTIZATION_PREPROCESSING
from appkit.logs import dropping_log_messages
from export.imdb import onnx_predictor
from export.imdb.onnx_predictor import FUSED_MODEL_FILE
from export.imdb.onnx_predictor import MODEL_FILES
from export.onnx_conversion import check_onnx_capable
from export.onnx_conversion import convert
from export.onnx_fused_attention import write_fused_model
from models import export_manifest
from models.imdb_text import MODEL_ID
from models.imdb_text import tokenizer_rules

INPUT_NAME = "token_ids"


def write_int8_model(float_model, int8_model):
    """Writes `int8_model`, the ONNX file `float_model` with int8 weights (ONNX Runtime's dynamic
    quantisation, signed int8 weights: what it quantises in our graph is the MatMul and Gather weights)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic

    with dropping_log_messages(*ORT_QUANTIZATION_PREPROCESSING):  # its advice changed nothing here
        quantize_dynamic(float_model, int8_model, weight_type=QuantType.QInt8)
    return Path(int8_model)


def write_float_model(model, path):
    """Converts the token-id classifier `model` with tf2onnx into the ONNX file `path`: input
    `token_ids` (int32 `[batch, length]`, both dynamic), output the probability `[batch, 1]`."""
    signature = [tf.TensorSpec([None, None], tf.int32, name=INPUT_NAME)]
    predict = tf.function(lambda token_ids: model(token_ids, training=False), input_signature=signature)
    convert(predict, path)
    return Path(path)


def write_fused_attention_model(float_model, fused_model):
    """Writes `fused_model`, the ONNX file `float_model` with ONNX Runtime's fused attention
    (`export.onnx_fused_attention`); returns its path, or None, writing nothing, when the rewrite
    refuses the graph (an attention family it does not match: the reason is logged)."""
    try:
        write_fused_model(float_model, fused_model)
    except ValueError as refusal:
        logging.getLogger(__name__).info("no %s: %s", Path(fused_model).name, refusal)
        return None
    return Path(fused_model)


def write_onnx_bundle(model, vocabulary_path, vocabulary_size, sequence_length, path):
    """Converts `model` with tf2onnx, quantises it, fuses its attention, and writes the predictor bundle into `path`
    (created), its manifest last (`vocabulary_size`: the model's, which the predictor checks the
    file against). A model with an attention family that does not export to ONNX raises the
    `check_onnx_capable` error naming it, before anything is written."""
    check_onnx_capable(model)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_float_model(model, path / MODEL_FILES[False])
    write_int8_model(path / MODEL_FILES[False], path / MODEL_FILES[True])
    write_fused_attention_model(path / MODEL_FILES[False], path / FUSED_MODEL_FILE)
    shutil.copyfile(vocabulary_path, path / "vocabulary.txt")
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_rules(sequence_length), indent=2) + "\n")
    shutil.copyfile(onnx_predictor.__file__, path / "onnx_predictor.py")
    shutil.copyfile(export_manifest.__file__, path / "export_manifest.py")
    export_manifest.write_manifest(
        path, MODEL_ID, "onnx", {"reviews": vocabulary_size}, keras_attn.__version__, INPUT_NAME
    )
    return path
