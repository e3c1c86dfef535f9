"""`translate`: prints the translation of each input sentence, from a training run or an export.

    python -m pipelines.translate --run runs/translator "¿Dónde está la estación?"
    python -m pipelines.translate --run runs/translator --attention alignment.html "Tengo hambre."
    echo "Tengo hambre." | python -m pipelines.translate --export artifacts/export/translator

`--run` is a training output directory (`translator.keras`, the vocabularies and
`run_config.json`); `--export` is a SavedModel (a version directory, or the model directory,
whose newest version is used) and needs no project code to run. `--attention out.html` (or
`out.png`; `--run` only) also writes the cross-attention alignment of each translation, per
decoder layer and head: an offline explorer page, or one PNG per sentence (`out.png`,
`out_2.png`, ...).

Every input line gets exactly one output line, in order: a blank line (or an empty or blank
argument) prints an empty line without running the model on it, so the outputs line up with
the inputs (`paste input.txt output.txt`). Input must be UTF-8: a line (or an argument) that is
not is refused before anything is translated, naming its line number (its position), since
neither the vectorisers nor an export's graph can read it and replacing bytes would translate
another sentence than the one given.
"""

import argparse
import dataclasses
import os
import sys

import numpy as np
import tensorflow as tf

from appkit.cli import add_debug_flag  # standard library only: --export still runs no model code
from appkit.cli import positive_int
from appkit.cli import user_errors_exit
from models import decoding_defaults  # imports nothing

ATTENTION_SUFFIXES = (".html", ".png")


def translate_with_run(run_dir, sentences, beam_size=decoding_defaults.BEAM_SIZE, batch_size=256, attention_path=None):
    """Translations from a training run (imports the model code only here: `--export` needs none),
    by beam search with the default length penalty (`beam_size` 1: greedy).

    With `attention_path` (.html or .png), also writes the cross-attention alignments there.
    """
    from models.decoding import decode_sentences
    from models.decoding import make_decoder
    from models.translation_text import detokenize
    from models.translator_run import load_run

    model, vectorizers, _ = load_run(run_dir)
    length_penalty = decoding_defaults.LENGTH_PENALTY if beam_size > 1 else 0.0
    decoder = make_decoder(model, vectorizers, beam_size=beam_size, length_penalty=length_penalty)
    translations = detokenize(decode_sentences(decoder, vectorizers, sentences, batch_size))
    if attention_path is not None:
        write_alignments(attention_path, model, vectorizers, decoder, sentences, translations)
    return translations


def write_alignments(path, model, vectorizers, decoder, sentences, translations):
    """The cross-attention of each translation: one explorer page (.html) or a PNG per sentence."""
    from keras_attn import visualization
    from models.translator_attention import alignment_maps

    root, suffix = os.path.splitext(path)
    maps, written = [], []
    for index, sentence in enumerate(sentences):
        target_ids = decoder(vectorizers.source_ids([sentence])).numpy()[0]
        sentence_maps = alignment_maps(model, vectorizers, sentence, target_ids)
        if suffix == ".png":
            png = path if index == 0 else f"{root}_{index + 1}{suffix}"
            figure = visualization.plot_model(sentence_maps, labelled=True)
            figure.suptitle(f"{sentence} → {translations[index]}")
            written.append(visualization.save_figure(figure, png))
        else:
            maps += [dataclasses.replace(m, name=f"{index + 1}. {sentence} | {m.name}") for m in sentence_maps]
    if suffix == ".html":
        pairs = "; ".join(f"{s} → {t}" for s, t in zip(sentences, translations))
        written.append(visualization.write_explorer(path, maps, title="Cross-attention alignments", subtitle=pairs))
    return written


def utf8_lines(raw_lines, origin):
    """Each of the byte strings `raw_lines` decoded from UTF-8, without its line ending; a
    ValueError naming `origin` and the 1-based position of the first one that is not UTF-8."""
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{origin} {number} is not UTF-8 (its byte {error.start + 1} is {raw[error.start]:#04x}): "
                "the input must be UTF-8 text (convert it first, e.g. `iconv -f latin1 -t utf-8`)"
            ) from None
    return lines


def input_lines(arguments):
    """The lines to translate: the command-line `arguments` if any, else stdin's lines."""
    if arguments:  # back to the bytes given: a non-UTF-8 argument reads as lone surrogates
        return utf8_lines([os.fsencode(argument) for argument in arguments], "argument")
    return utf8_lines(sys.stdin.buffer, "stdin line")


def translate_each_line(translate, lines):
    """`translate(sentences)` of the lines that hold text, and an empty string for each blank one:
    exactly one output per line, in order."""
    sentences = [line.strip() for line in lines]
    texts = [sentence for sentence in sentences if sentence]
    translations = iter(translate(texts) if texts else [])
    return [next(translations) if sentence else "" for sentence in sentences]


def latest_version(export_dir):
    """`export_dir` itself when it is a SavedModel, else its highest numbered version."""
    if os.path.isfile(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    versions = [name for name in os.listdir(export_dir) if name.isdigit()] if os.path.isdir(export_dir) else []
    if not versions:
        raise ValueError(f"`export_dir` holds no SavedModel version. Received: export_dir={export_dir!r}")
    return os.path.join(export_dir, max(versions, key=int))


def translate_with_export(export_dir, sentences, greedy=False):
    """Runs the SavedModel's `serving_default` (beam search) or, with `greedy`, its greedy signature
    (TensorFlow only, no model code), once its manifest proves every file intact and the export a
    translator's."""
    from models.export_manifest import check_manifest  # standard library only
    from models.translation_text import MODEL_ID

    version = latest_version(export_dir)
    check_manifest(version, MODEL_ID)
    signature = decoding_defaults.GREEDY_SIGNATURE if greedy else "serving_default"
    serving = tf.saved_model.load(version).signatures[signature]
    outputs = serving(source=tf.constant(sentences, tf.string))
    return [text.decode("utf-8") for text in np.asarray(outputs["translation"]).tolist()]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.translate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    origin = parser.add_mutually_exclusive_group(required=True)
    origin.add_argument("--run", help="training output directory (checkpoint + vocabularies)")
    origin.add_argument("--export", help="SavedModel directory (a version, or the model's versions)")
    parser.add_argument(
        "--beam-size",
        type=positive_int,
        default=decoding_defaults.BEAM_SIZE,
        help=f"1 = greedy (default {decoding_defaults.BEAM_SIZE}; an export serves {decoding_defaults.BEAM_SIZE} and 1)",
    )
    parser.add_argument(
        "--attention",
        metavar="PATH",
        help="also write the cross-attention alignments: .html (explorer) or .png (--run only)",
    )
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: one per line on stdin)")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    with user_errors_exit(parser.prog, args.debug):
        lines = input_lines(args.sentences)
    if not lines:
        parser.error("no sentences: pass them as arguments or on stdin")
    if args.attention is not None:
        if not args.run:
            parser.error("--attention needs --run (an export holds no attention weights)")
        if os.path.splitext(args.attention)[1] not in ATTENTION_SUFFIXES:
            parser.error(f"--attention must end in .html or .png, got {args.attention!r}")
    if args.export and args.beam_size not in (1, decoding_defaults.BEAM_SIZE):
        parser.error(f"--beam-size with --export must be 1 or {decoding_defaults.BEAM_SIZE}, got {args.beam_size}")
    with user_errors_exit(parser.prog, args.debug):
        if args.run:
            translations = translate_each_line(
                lambda texts: translate_with_run(
                    args.run, texts, beam_size=args.beam_size, attention_path=args.attention
                ),
                lines,
            )
        else:
            translations = translate_each_line(
                lambda texts: translate_with_export(args.export, texts, greedy=args.beam_size == 1), lines
            )
    for translation in translations:
        print(translation)


if __name__ == "__main__":
    main()
