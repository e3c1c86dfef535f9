"""Exports a trained translator as a TF Serving SavedModel and as ONNX graphs, verified.

    python -m export.translator --run runs/translator --export-dir artifacts/export

Writes `<export-dir>/translator/<version>/` (TF Serving's layout; the version is one more than
the highest present; `<export-dir>/models.config` lists it) holding:

- the SavedModel (`export.translator.savedmodel`), raw source strings in, translations out, by
  beam search (`serving_default`) and greedily (`greedy`);
  `assets.extra/tf_serving_warmup_requests` holds two `source` batches;
- `onnx/encoder.onnx` and `onnx/decoder_step.onnx` with the vocabularies and
  `onnx/decoding.json` (`export.translator.onnx_graphs`), unless `--no-onnx`. The ONNX graphs
  carry a key/value self-attention cache: a translator whose self-attention family decodes with
  another cache (`--attention linear`: a recurrent state) stops with an error naming the family
  before anything is written; `--no-onnx` exports its SavedModel alone.

Before the version directory appears (an atomic rename of a temporary directory), the export is
checked on test sentences: the SavedModel reloaded in a fresh Python process with no project code
must give the Keras model's translations with each signature's search, and the ONNX greedy
decoder the Keras greedy decoder's tokens.
Any disagreement raises `ExportVerificationError` and publishes nothing.
"""

import argparse
import json
import os

import numpy as np

import keras_attn
from appkit.cli import add_debug_flag
from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from export.fresh_process import ExportVerificationError
from export.fresh_process import serve_in_fresh_process
from export.serving_layout import SIGNATURE
from export.serving_layout import publish
from export.serving_layout import staging_directory
from export.serving_layout import write_models_config
from export.serving_layout import write_warmup_requests
from export.translator.onnx_graphs import OnnxGreedyDecoder
from export.translator.onnx_graphs import check_onnx_exportable
from export.translator.onnx_graphs import write_onnx
from export.translator.savedmodel import SEARCHES
from export.translator.savedmodel import SIGNATURE_INPUT
from export.translator.savedmodel import SIGNATURE_OUTPUT
from export.translator.savedmodel import write_saved_model
from models.decoding import decode_sentences
from models.decoding import make_decoder
from models.export_manifest import write_manifest
from models.translation_text import MODEL_ID
from models.translation_text import detokenize
from models.translator_run import held_out_sources
from models.translator_run import load_run

MODEL_NAME = "translator"


def reload_translations(saved_model_dir, sentences, signature=SIGNATURE):
    """Translations from the SavedModel's `signature`, loaded in a fresh process without project code."""
    inputs = {SIGNATURE_INPUT: list(sentences)}
    return serve_in_fresh_process(saved_model_dir, inputs, signature)[SIGNATURE_OUTPUT]


def _first_mismatch(expected, received):
    for position, (wanted, got) in enumerate(zip(expected, received)):
        if not np.array_equal(wanted, got):
            return position, wanted, got
    return None


def verify_signature(model, vectorizers, version_dir, sentences, signature):
    """Raises `ExportVerificationError` unless the SavedModel's `signature`, reloaded in a fresh
    process, translates `sentences` as the Keras model decodes them with the same search."""
    beam_size, length_penalty = SEARCHES[signature]
    decoder = make_decoder(model, vectorizers, beam_size=beam_size, length_penalty=length_penalty)
    expected_text = detokenize(decode_sentences(decoder, vectorizers, sentences))
    reloaded = reload_translations(version_dir, sentences, signature)
    mismatch = _first_mismatch(expected_text, reloaded)
    if mismatch or len(reloaded) != len(expected_text):
        raise ExportVerificationError(
            f"SavedModel translation ({signature}) differs from Keras at sentence {mismatch}: "
            f"{sentences[mismatch[0]]!r}"
            if mismatch
            else f"SavedModel returned {len(reloaded)} translations for {len(expected_text)} sentences"
        )


def verify_export(model, vectorizers, version_dir, sentences, onnx=True):
    """Raises `ExportVerificationError` unless the SavedModel's signatures (beam search and greedy)
    and, with `onnx`, the ONNX greedy decoder agree with Keras."""
    for signature in SEARCHES:
        verify_signature(model, vectorizers, version_dir, sentences, signature)
    if not onnx:
        return {"sentences": len(sentences), "saved_model_matches": True}
    decoder = make_decoder(model, vectorizers)
    expected_ids = np.concatenate(
        [decoder(vectorizers.source_ids(sentences[i : i + 256])).numpy() for i in range(0, len(sentences), 256)]
    )
    onnx_decoder = OnnxGreedyDecoder(os.path.join(version_dir, "onnx"))
    onnx_ids = np.concatenate(
        [onnx_decoder(vectorizers.source_ids(sentences[i : i + 256])) for i in range(0, len(sentences), 256)]
    )
    mismatch = _first_mismatch(expected_ids, onnx_ids)
    if mismatch:
        raise ExportVerificationError(
            f"ONNX greedy tokens differ from the TF decoder at sentence {mismatch[0]} "
            f"({sentences[mismatch[0]]!r}): TF {mismatch[1].tolist()} vs ONNX {mismatch[2].tolist()}"
        )
    return {"sentences": len(sentences), "saved_model_matches": True, "onnx_matches": True}


def export_translator(model, vectorizers, export_dir, sentences, onnx=True):
    """Writes, verifies and atomically publishes `<export_dir>/translator/<version>`: the
    SavedModel, and with `onnx` the ONNX graphs (a model they cannot carry raises the
    `check_onnx_exportable` error before anything is written).

    The same TF Serving layout as the IMDB export (`export.serving_layout`): built in a readable
    hidden directory beside the versions with warmup requests (one sentence, then a batch of up
    to 8), renamed to the next free version only once verified, then listed in `models.config`.
    """
    if onnx:
        check_onnx_exportable(model)
    model_dir = os.path.join(export_dir, MODEL_NAME)
    with staging_directory(model_dir) as staging:
        write_saved_model(model, vectorizers, str(staging))
        write_warmup_requests(staging, MODEL_NAME, SIGNATURE_INPUT, [sentences[:1], sentences[:8]])
        if onnx:
            write_onnx(model, vectorizers, os.path.join(staging, "onnx"))
        sizes = {"source": vectorizers.source.vocabulary_size(), "target": vectorizers.target.vocabulary_size()}
        export_format = "savedmodel+onnx" if onnx else "savedmodel"
        write_manifest(staging, MODEL_ID, export_format, sizes, keras_attn.__version__, SIGNATURE_INPUT)
        report = verify_export(model, vectorizers, str(staging), sentences, onnx)
        final = publish(staging, model_dir)
    write_models_config(export_dir)
    return str(final), report


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.translator", description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/translator", help="training output directory")
    parser.add_argument("--export-dir", default="artifacts/export", help="TF Serving base directory")
    parser.add_argument("--verify-sentences", type=positive_int, default=200, help="test sentences checked")
    parser.add_argument(
        "--no-onnx",
        dest="onnx",
        action="store_false",
        help="export the SavedModel alone (a self-attention the ONNX graphs cannot carry, e.g. --attention linear)",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    with user_errors_exit(parser.prog, args.debug):
        require_writable_directory(args.export_dir, "--export-dir")
        model, vectorizers, _ = load_run(args.run)
        sentences = held_out_sources(args.run, args.verify_sentences)
        path, report = export_translator(model, vectorizers, args.export_dir, sentences, args.onnx)
    print(json.dumps({"export": path, **report}, indent=2))
