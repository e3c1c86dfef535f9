"""Decoding the translator: tokens/s of greedy and beam-4 search on every runtime it ships to.

The same source sentences (2,000 by default: the held-out test sentences of a trained run given by
`--run`, or, without one, the first pairs of the data with a freshly built translator of the
default configuration, whose speed does not depend on its weights) are decoded, in batches of
`--batch-size`, by:

- Keras, cached: `models.decoding.make_decoder` (the key/value cache, one compiled `while` loop per
  batch), without and with XLA (`jit_compile`), greedy and beam-4;
- Keras, recomputed: the same search re-running the whole decoder over the prefix at every step
  (`use_cache=False`, without XLA), greedy: the peer of the cache;
- the SavedModel (`export.translator`: raw strings in, translated strings out, tokenisation
  included), as served: its `greedy` signature, and `serving_default` (beam 4);
- ONNX Runtime: the exported `encoder.onnx` + `decoder_step.onnx` driven by the greedy loop of
  `export.translator.onnx_graphs.OnnxGreedyDecoder` (its sessions made once; one session run per token).

Tokens are the ids each search emits after `[start]` up to and including `[end]`, counted once per
search from Keras's cached output (every runtime decodes the same tokens: greedy outputs are
compared). Each configuration decodes the whole set `--repeats` times in turn with the others and
keeps its best time; the ratio is to Keras cached greedy without XLA, measured in the same run.

    python -m benchmarks.translator_decoding [--run runs/translator] [--sentences 2000]
"""

import dataclasses
import os
import sys
import tempfile

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from export.serving_layout import SIGNATURE  # noqa: E402
from export.translator.onnx_graphs import OnnxGreedyDecoder  # noqa: E402
from export.translator.onnx_graphs import write_onnx  # noqa: E402
from export.translator.savedmodel import write_saved_model  # noqa: E402
from models import decoding_defaults  # noqa: E402
from models.decoding import make_decoder  # noqa: E402
from models.parallel_text import orient_pairs  # noqa: E402
from models.parallel_text import read_pairs  # noqa: E402
from models.translation_text import TranslationVectorizers  # noqa: E402
from models.translator import TranslatorConfig  # noqa: E402
from models.translator import build_translator  # noqa: E402
from models.translator_run import held_out_sources  # noqa: E402
from models.translator_run import load_run  # noqa: E402
from models.vocabulary import PADDING_ID  # noqa: E402
from pipelines.train_translator import DEFAULT_DATA  # noqa: E402
from pipelines.translation_data import build_vocabularies  # noqa: E402

PEER_RATIO = "x_keras_cached"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = [
    "--sentences",
    "600",
    "--repeats",
    "1",
]  # `make bench` (benchmarks/run_all.py): 600 of the 2,000 sentences, one timed pass (within `make bench`'s budget)

SMOKE_CONFIG = TranslatorConfig(
    source_vocabulary_size=500,
    target_vocabulary_size=500,
    sequence_length=12,
    embedding_dim=16,
    intermediate_dim=32,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
)


def fresh_translator(data, count, config):
    """An untrained translator of `config`, its vocabularies built on the first `count` pairs, and their sources."""
    sources, targets = orient_pairs(read_pairs(data), ("en", "es"), "es", "en")
    sources, targets = sources[:count], targets[:count]
    vocabularies = build_vocabularies(sources, targets, config.source_vocabulary_size, config.target_vocabulary_size)
    vectorizers = TranslationVectorizers(*vocabularies, sequence_length=config.sequence_length)
    config = dataclasses.replace(  # as training does: the model's vocabularies are the adapted ones
        config,
        source_vocabulary_size=vectorizers.source_vocabulary_size,
        target_vocabulary_size=vectorizers.target_vocabulary_size,
    )
    return build_translator(config), vectorizers, sources


def emitted_tokens(ids, end_id):
    """Tokens after `[start]` up to and including `[end]` in `(batch, length)` ids."""
    emitted = 0
    for row in np.asarray(ids)[:, 1:]:
        ends = np.flatnonzero(row == end_id)
        emitted += int(ends[0]) + 1 if ends.size else int(np.count_nonzero(row != PADDING_ID))
    return emitted


def batches(items, size):
    return [items[begin : begin + size] for begin in range(0, len(items), size)]


def candidates_for(model, vectorizers, sentences, batch_size, export_dir):
    """`{name: (search, decode_all)}`: each decodes every batch and returns the ids (or strings)."""
    source_batches = [vectorizers.source_ids(batch) for batch in batches(sentences, batch_size)]

    def keras(beam_size, jit_compile, use_cache=True):
        length_penalty = decoding_defaults.LENGTH_PENALTY if beam_size > 1 else 0.0  # as the SavedModel serves
        decoder = make_decoder(
            model,
            vectorizers,
            beam_size=beam_size,
            jit_compile=jit_compile,
            use_cache=use_cache,
            length_penalty=length_penalty,
        )
        return lambda: np.concatenate([decoder(ids).numpy() for ids in source_batches])

    write_saved_model(model, vectorizers, os.path.join(export_dir, "saved_model"))
    signatures = tf.saved_model.load(os.path.join(export_dir, "saved_model")).signatures

    def saved_model(signature):
        serve = signatures[signature]
        return lambda: [serve(source=batch) for batch in string_batches]

    string_batches = [tf.constant(batch) for batch in batches(sentences, batch_size)]
    write_onnx(model, vectorizers, os.path.join(export_dir, "onnx"))
    onnx_decoder = OnnxGreedyDecoder(os.path.join(export_dir, "onnx"))
    return {
        "keras cached": ("greedy", keras(1, False)),
        "keras cached XLA": ("greedy", keras(1, True)),
        "keras recomputed": ("greedy", keras(1, False, use_cache=False)),
        "SavedModel": ("greedy", saved_model(decoding_defaults.GREEDY_SIGNATURE)),
        "ONNX Runtime": ("greedy", lambda: np.concatenate([onnx_decoder(ids) for ids in source_batches])),
        "keras cached, beam 4": ("beam-4", keras(4, False)),
        "keras cached XLA, beam 4": ("beam-4", keras(4, True)),
        "SavedModel, beam 4": ("beam-4", saved_model(SIGNATURE)),
    }


def check_greedy_agreement(outputs):
    """Keras's greedy runtimes and ONNX Runtime emit the same ids (the SavedModel is checked by export)."""
    reference = outputs["keras cached"]
    for name in ("keras cached XLA", "keras recomputed", "ONNX Runtime"):
        if not np.array_equal(outputs[name], reference):
            rows = int(np.sum(np.any(outputs[name] != reference, axis=1)))
            print(f"note: {name} differs from keras cached on {rows} of {len(reference)} sentences (float rounding)")


def measure(model, vectorizers, sentences, batch_size, repeats):
    with tempfile.TemporaryDirectory() as export_dir:
        candidates = candidates_for(model, vectorizers, sentences, batch_size, export_dir)
        outputs = {name: decode() for name, (_, decode) in candidates.items()}  # warm-up: traces, compiles
        seconds = measurement.best_seconds_round_robin(
            {name: decode for name, (_, decode) in candidates.items()}, repeats, warmup=0
        )
    check_greedy_agreement(outputs)
    tokens = {
        "greedy": emitted_tokens(outputs["keras cached"], vectorizers.end_id),
        "beam-4": emitted_tokens(outputs["keras cached, beam 4"], vectorizers.end_id),
    }
    rows = [
        {
            "runtime": name,
            "search": search,
            "sentences": len(sentences),
            "tokens": tokens[search],
            "seconds": seconds[name],
            "tokens_per_s": tokens[search] / seconds[name],
        }
        for name, (search, _) in candidates.items()
    ]
    peer = next(row["tokens_per_s"] for row in rows if row["runtime"] == "keras cached")
    for row in rows:
        row[PEER_RATIO] = row["tokens_per_s"] / peer
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        run=dict(default=None, help="a trained translator's run directory (default: a fresh untrained translator)"),
        data=dict(default=str(DEFAULT_DATA), help="the pairs, for a fresh translator"),
        sentences=dict(type=int, default=2000),
        batch_size=dict(type=int, default=256),
        repeats=dict(type=int, default=2),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sentences, args.batch_size, args.repeats = 24, 12, 1
    if args.run:
        model, vectorizers, _ = load_run(args.run)
        sentences = held_out_sources(args.run, args.sentences)
    else:
        config = SMOKE_CONFIG if args.smoke else TranslatorConfig()
        model, vectorizers, sentences = fresh_translator(args.data, max(args.sentences, 400), config)
        sentences = sentences[: args.sentences]
    rows = measure(model, vectorizers, sentences, args.batch_size, args.repeats)
    measurement.print_table(
        rows,
        [
            ("runtime", "runtime", "{}"),
            ("search", "search", "{}"),
            ("tokens", "tokens", "{}"),
            ("seconds", "seconds", "{:.2f}"),
            ("tokens_per_s", "tokens/s", "{:.0f}"),
            (PEER_RATIO, "x Keras cached", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k != "output"}
    measurement.write_results(
        "translator_decoding" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
