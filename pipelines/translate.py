"""`translate`: prints the translation of each input sentence, from a training run or an export.

    python -m pipelines.translate --run runs/translator "¿Dónde está la estación?"
    echo "Tengo hambre." | python -m pipelines.translate --export artifacts/export/translator

`--run` is a training output directory (`translator.keras`, the vocabularies and
`run_config.json`); `--export` is a SavedModel (a version directory, or the model directory,
whose newest version is used) and needs no project code to run.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf


def translate_with_run(run_dir, sentences, beam_size=1, batch_size=256):
    """Translations from a training run (imports the model code only here: `--export` needs none)."""
    from models.decoding import decode_sentences
    from models.decoding import make_decoder
    from models.translation_text import detokenize
    from models.translator_run import load_run

    model, vectorizers, _ = load_run(run_dir)
    decoder = make_decoder(model, vectorizers, beam_size=beam_size)
    return detokenize(decode_sentences(decoder, vectorizers, sentences, batch_size))


def latest_version(export_dir):
    """`export_dir` itself when it is a SavedModel, else its highest numbered version."""
    if os.path.isfile(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    versions = [name for name in os.listdir(export_dir) if name.isdigit()] if os.path.isdir(export_dir) else []
    if not versions:
        raise ValueError(f"`export_dir` holds no SavedModel version. Received: export_dir={export_dir!r}")
    return os.path.join(export_dir, max(versions, key=int))


def translate_with_export(export_dir, sentences):
    """Runs the SavedModel's `serving_default` signature (TensorFlow only, no project code)."""
    serving = tf.saved_model.load(latest_version(export_dir)).signatures["serving_default"]
    outputs = serving(source=tf.constant(sentences, tf.string))
    return [text.decode("utf-8") for text in np.asarray(outputs["translation"]).tolist()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    origin = parser.add_mutually_exclusive_group(required=True)
    origin.add_argument("--run", help="training output directory (checkpoint + vocabularies)")
    origin.add_argument("--export", help="SavedModel directory (a version, or the model's versions)")
    parser.add_argument("--beam-size", type=int, default=1, help="beam size (--run only; 1 = greedy)")
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: one per line on stdin)")
    args = parser.parse_args(argv)
    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    if not sentences:
        parser.error("no sentences: pass them as arguments or on stdin")
    if args.run:
        translations = translate_with_run(args.run, sentences, beam_size=args.beam_size)
    else:
        translations = translate_with_export(args.export, sentences)
    for translation in translations:
        print(translation)


if __name__ == "__main__":
    main()
