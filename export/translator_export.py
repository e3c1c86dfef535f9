"""Exports a trained translator as a TF Serving SavedModel and as ONNX graphs, verified.

    python -m export.translator_export --run runs/translator --export-dir artifacts/export

Writes `<export-dir>/translator/<version>/` (TF Serving's layout; the version is one more than
the highest present; `<export-dir>/models.config` lists it) holding:

- the SavedModel, whose `serving_default` signature maps a batch of raw source strings
  (`source`, `tf.string`, `(batch,)`) to translated strings (`translation`): tokenisation
  (`TextVectorization`), the encoder, the cached greedy decoding loop and detokenisation all run
  in the graph; `assets.extra/tf_serving_warmup_requests` holds two `source` batches;
- `onnx/encoder.onnx` (source ids -> the decoder's cross-attention keys/values, projected once)
  and `onnx/decoder_step.onnx` (one token + the self-attention cache -> logits + the updated
  cache), with dynamic batch and lengths, plus the vocabularies and `onnx/decoding.json`;
  `onnx_greedy_decode` drives them with onnxruntime.

Before the version directory appears (an atomic rename of a temporary directory), the export is
checked on test sentences: the SavedModel reloaded in a fresh Python process with no project code
must give the Keras model's translations, and the ONNX greedy decoder the Keras decoder's tokens.
Any disagreement raises `ExportVerificationError` and publishes nothing.
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

import keras_attn

from appkit.cli import add_debug_flag
from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from export.fresh_process import ExportVerificationError
from export.fresh_process import serve_in_fresh_process
from export.serving_layout import SIGNATURE
from export.serving_layout import one_dimensional_batch
from export.serving_layout import publish
from export.serving_layout import staging_directory
from export.serving_layout import write_models_config
from export.serving_layout import write_warmup_requests
from models.decoding import cross_attention_caches
from models.decoding import decode_sentences
from models.decoding import decoder_step
from models.decoding import make_decoder
from models.decoding import translate_ids
from models.export_manifest import write_manifest
from models.translation_text import MODEL_ID
from models.translation_text import detokenize
from models.translation_text import translation_vectorizer
from models.translator_run import held_out_sources
from models.translator_run import load_run
from models.vocabulary import PADDING_ID

MODEL_NAME = "translator"
ONNX_OPSET = 18
SIGNATURE_INPUT = "source"
SIGNATURE_OUTPUT = "translation"

def serving_function(model, vectorizers):
    """`serve(source) -> {"translation": ...}`: raw strings in, translated strings out."""
    source_vectorizer = translation_vectorizer(
        vectorizers.source_vocabulary, lowercase=True, sequence_length=vectorizers.sequence_length
    )
    source_vectorizer.build((None,))
    target_tokens = tf.constant(vectorizers.target.get_vocabulary(), tf.string)

    def serve(source):
        source = one_dimensional_batch(source)
        source_ids = tf.cast(source_vectorizer(source), tf.int32)  # (batch, sequence_length)
        ids = translate_ids(model, source_ids, vectorizers.start_id, vectorizers.end_id)[:, 1:]
        words = tf.ragged.boolean_mask(
            tf.gather(target_tokens, ids),
            tf.logical_and(tf.not_equal(ids, vectorizers.end_id), tf.not_equal(ids, PADDING_ID)),
        )  # (batch, None): the tokens before `[end]`
        return {SIGNATURE_OUTPUT: detokenize(tf.strings.reduce_join(words, axis=1, separator=" "))}

    return serve, source_vectorizer


def write_saved_model(model, vectorizers, path):
    serve, source_vectorizer = serving_function(model, vectorizers)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(source_vectorizer)
    archive.add_endpoint(
        name=SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec((None,), tf.string, name=SIGNATURE_INPUT)],
    )
    archive.write_out(str(path), verbose=False)


def _stacked_caches(model):
    """`(layers, heads, head_dim)`: the static sizes of the stacked caches `(layers, 2, length, heads, head_dim)`."""
    return len(model.decoder_layers), model.num_heads, model.embedding_dim // model.num_heads


def onnx_functions(model):
    """The encoder and one cached decoder step as `tf.function`s with dynamic batch and lengths."""
    layers, heads, head_dim = _stacked_caches(model)
    cache_spec = (None, layers, 2, None, heads, head_dim)

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32, name="source_ids")])
    def encoder(source_ids):
        caches = cross_attention_caches(model, model.encode(source_ids))
        return {"cross_cache": tf.stack(caches, axis=1)}  # (batch, layers, 2, source_len, heads, head_dim)

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1), tf.int32, name="token"),
            tf.TensorSpec((), tf.int32, name="index"),
            tf.TensorSpec(cache_spec, tf.float32, name="self_cache"),
            tf.TensorSpec(cache_spec, tf.float32, name="cross_cache"),
            tf.TensorSpec((None, None), tf.int32, name="source_ids"),
        ]
    )
    def step(token, index, self_cache, cross_cache, source_ids):
        logits, updated = decoder_step(
            model,
            token,
            tf.unstack(self_cache, layers, axis=1),
            tf.unstack(cross_cache, layers, axis=1),
            model.source_padding_mask(source_ids),
            index,
        )
        return {"logits": logits, "updated_self_cache": tf.stack(updated, axis=1)}

    return encoder, step


def _dynamic_update_slice_to_onnx(ctx, node, name, args):
    """tf2onnx handler: `XlaDynamicUpdateSlice(operand, update, starts)` (the key/value cache write
    of `keras.ops.slice_update`), which tf2onnx lacks, as
    `Where(Pad(ones_like(update)), Pad(update), operand)` with pads `starts` and
    `shape(operand) - starts - shape(update)`."""
    import onnx
    from onnx import numpy_helper

    operand, update, starts = node.input
    operand_shape = ctx.make_node("Shape", [operand]).output[0]
    update_shape = ctx.make_node("Shape", [update]).output[0]
    before = ctx.make_node("Cast", [starts], attr={"to": onnx.TensorProto.INT64}).output[0]
    room = ctx.make_node("Sub", [operand_shape, before]).output[0]
    after = ctx.make_node("Sub", [room, update_shape]).output[0]
    pads = ctx.make_node("Concat", [before, after], attr={"axis": 0}).output[0]
    padded_update = ctx.make_node("Pad", [update, pads]).output[0]
    ones = ctx.make_node(
        "ConstantOfShape", [update_shape], attr={"value": numpy_helper.from_array(np.ones(1, np.float32))}
    ).output[0]
    written = ctx.make_node("Pad", [ones, pads]).output[0]
    where_written = ctx.make_node("Cast", [written], attr={"to": onnx.TensorProto.BOOL}).output[0]
    node.type = "Where"
    ctx.replace_inputs(node, [where_written, padded_update, operand])
    return node


def write_onnx(model, vectorizers, directory):
    import tf2onnx

    os.makedirs(directory, exist_ok=True)
    encoder, step = onnx_functions(model)
    for name, function in (("encoder", encoder), ("decoder_step", step)):
        tf2onnx.convert.from_function(
            function,
            input_signature=function.input_signature,
            opset=ONNX_OPSET,
            custom_op_handlers={"XlaDynamicUpdateSlice": (_dynamic_update_slice_to_onnx, [])},
            output_path=os.path.join(directory, f"{name}.onnx"),
        )
    layers, heads, head_dim = _stacked_caches(model)
    with open(os.path.join(directory, "decoding.json"), "w", encoding="utf-8") as handle:
        json.dump(
            {
                "start_id": vectorizers.start_id,
                "end_id": vectorizers.end_id,
                "padding_id": PADDING_ID,
                "max_length": vectorizers.sequence_length,
                "cache_shape": [layers, 2, heads, head_dim],
            },
            handle,
            indent=1,
        )
    vectorizers.save(directory)


def onnx_greedy_decode(directory, source_ids):
    """Greedy decoding with onnxruntime only: `(batch, max_length)` ids like `translate_ids`."""
    import onnxruntime

    with open(os.path.join(directory, "decoding.json"), encoding="utf-8") as handle:
        decoding = json.load(handle)
    options = {"providers": ["CPUExecutionProvider"]}
    encoder = onnxruntime.InferenceSession(os.path.join(directory, "encoder.onnx"), **options)
    step = onnxruntime.InferenceSession(os.path.join(directory, "decoder_step.onnx"), **options)
    source_ids = np.asarray(source_ids, np.int32)
    batch, max_length = source_ids.shape[0], decoding["max_length"]
    (cross_cache,) = encoder.run(None, {"source_ids": source_ids})
    layers, pair, heads, head_dim = decoding["cache_shape"]
    self_cache = np.zeros((batch, layers, pair, max_length, heads, head_dim), np.float32)
    tokens = np.full((batch, max_length), decoding["padding_id"], np.int32)
    tokens[:, 0] = decoding["start_id"]
    finished = np.zeros(batch, bool)
    output_names = [output.name for output in step.get_outputs()]
    for index in range(max_length - 1):
        outputs = step.run(
            None,
            {
                "token": tokens[:, index : index + 1],
                "index": np.asarray(index, np.int32),
                "self_cache": self_cache,
                "cross_cache": cross_cache,
                "source_ids": source_ids,
            },
        )
        outputs = dict(zip(output_names, outputs))
        self_cache = outputs["updated_self_cache"]
        next_ids = np.argmax(outputs["logits"], axis=-1).astype(np.int32)
        next_ids[finished] = decoding["padding_id"]
        tokens[:, index + 1] = next_ids
        finished |= next_ids == decoding["end_id"]
        if finished.all():
            break
    return tokens


def reload_translations(saved_model_dir, sentences):
    """Translations from the SavedModel, loaded in a fresh process without project code."""
    return serve_in_fresh_process(saved_model_dir, {SIGNATURE_INPUT: list(sentences)})[SIGNATURE_OUTPUT]


def _first_mismatch(expected, received):
    for position, (wanted, got) in enumerate(zip(expected, received)):
        if not np.array_equal(wanted, got):
            return position, wanted, got
    return None


def verify_export(model, vectorizers, version_dir, sentences):
    """Raises `ExportVerificationError` unless the SavedModel and ONNX agree with Keras."""
    decoder = make_decoder(model, vectorizers)
    expected_ids = np.concatenate(
        [decoder(vectorizers.source_ids(sentences[i : i + 256])).numpy() for i in range(0, len(sentences), 256)]
    )
    expected_text = detokenize(decode_sentences(decoder, vectorizers, sentences))
    reloaded = reload_translations(version_dir, sentences)
    mismatch = _first_mismatch(expected_text, reloaded)
    if mismatch or len(reloaded) != len(expected_text):
        raise ExportVerificationError(
            f"SavedModel translation differs from Keras at sentence {mismatch}: {sentences[mismatch[0]]!r}"
            if mismatch
            else f"SavedModel returned {len(reloaded)} translations for {len(expected_text)} sentences"
        )
    onnx_ids = np.concatenate(
        [
            onnx_greedy_decode(os.path.join(version_dir, "onnx"), vectorizers.source_ids(sentences[i : i + 256]))
            for i in range(0, len(sentences), 256)
        ]
    )
    mismatch = _first_mismatch(expected_ids, onnx_ids)
    if mismatch:
        raise ExportVerificationError(
            f"ONNX greedy tokens differ from the TF decoder at sentence {mismatch[0]} "
            f"({sentences[mismatch[0]]!r}): TF {mismatch[1].tolist()} vs ONNX {mismatch[2].tolist()}"
        )
    return {"sentences": len(sentences), "saved_model_matches": True, "onnx_matches": True}


def export_translator(model, vectorizers, export_dir, sentences):
    """Writes, verifies and atomically publishes `<export_dir>/translator/<version>`.

    The same TF Serving layout as the IMDB export (`export.serving_layout`): built in a readable
    hidden directory beside the versions with warmup requests (one sentence, then a batch of up
    to 8), renamed to the next free version only once verified, then listed in `models.config`.
    """
    model_dir = os.path.join(export_dir, MODEL_NAME)
    with staging_directory(model_dir) as staging:
        write_saved_model(model, vectorizers, str(staging))
        write_warmup_requests(staging, MODEL_NAME, SIGNATURE_INPUT, [sentences[:1], sentences[:8]])
        write_onnx(model, vectorizers, os.path.join(staging, "onnx"))
        sizes = {"source": vectorizers.source.vocabulary_size(), "target": vectorizers.target.vocabulary_size()}
        write_manifest(staging, MODEL_ID, "savedmodel+onnx", sizes, keras_attn.__version__, SIGNATURE_INPUT)
        report = verify_export(model, vectorizers, str(staging), sentences)
        final = publish(staging, model_dir)
    write_models_config(export_dir)
    return str(final), report


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.translator_export", description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/translator", help="training output directory")
    parser.add_argument("--export-dir", default="artifacts/export", help="TF Serving base directory")
    parser.add_argument("--verify-sentences", type=positive_int, default=200, help="test sentences checked")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    with user_errors_exit(parser.prog, args.debug):
        require_writable_directory(args.export_dir, "--export-dir")
        model, vectorizers, _ = load_run(args.run)
        sentences = held_out_sources(args.run, args.verify_sentences)
        path, report = export_translator(model, vectorizers, args.export_dir, sentences)
    print(json.dumps({"export": path, **report}, indent=2))


if __name__ == "__main__":
    main()
