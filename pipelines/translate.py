"""`translate`: prints the translation of each input sentence, from a training run or an export.

    python -m pipelines.translate --run runs/translator "¿Dónde está la estación?"
    echo "Tengo hambre." | python -m pipelines.translate --export artifacts/export/translator

`--run` is a training output directory (`translator.keras`, the vocabularies and
`run_config.json`); `--export` is a SavedModel (a version directory, or the model directory,
whose newest version is used) and needs no project code to run.
"""

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

RUN_CONFIG = "run_config.json"
MODEL_FILE = "translator.keras"


def load_run(run_dir):
    """`(model, vectorizers, run_config)` of a finished training run."""
    import keras

    from models import translator  # noqa: F401  (registers the serialisable classes)
    from pipelines.translation_data import TranslationVectorizers

    config_path = os.path.join(run_dir, RUN_CONFIG)
    if not os.path.isfile(config_path):
        raise ValueError(f"`run_dir` holds no {RUN_CONFIG}. Received: run_dir={run_dir!r}")
    with open(config_path, encoding="utf-8") as handle:
        run_config = json.load(handle)
    model = keras.saving.load_model(os.path.join(run_dir, MODEL_FILE), compile=False)
    vectorizers = TranslationVectorizers.load(run_dir, model.sequence_length)
    return model, vectorizers, run_config


def make_decoder(model, vectorizers, beam_size=1, jit_compile=False, use_cache=True):
    """A `tf.function` mapping `(batch, sequence_length)` source ids to target ids."""
    from models.decoding import translate_ids

    @tf.function(
        jit_compile=jit_compile,
        input_signature=[tf.TensorSpec((None, vectorizers.sequence_length), tf.int32)],
    )
    def decode(source_ids):
        return translate_ids(
            model,
            source_ids,
            vectorizers.start_id,
            vectorizers.end_id,
            beam_size=beam_size,
            use_cache=use_cache,
        )

    return decode


def decode_sentences(decoder, vectorizers, sentences, batch_size=256):
    """Target token lists for `sentences`, decoded `batch_size` at a time."""
    tokens = []
    for begin in range(0, len(sentences), batch_size):
        ids = decoder(vectorizers.source_ids(sentences[begin : begin + batch_size])).numpy()
        tokens.extend(vectorizers.target_tokens(row) for row in ids)
    return tokens


def translate_with_run(run_dir, sentences, beam_size=1, batch_size=256):
    from pipelines.translation_data import detokenize

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
