"""`runs/translator/report.html`: the translator run's page, self-contained like the IMDB one.

BLEU and chrF (greedy and beam, against every reference and per pair), token accuracy, timing,
the learning curves, and the cross-attention alignments of the run's example test sentences
(short to long) in the explorer, with their references.
"""

import dataclasses
import html

from appkit.files import write_text_atomic
from keras_attn.visualization import explorer_html
from keras_attn.visualization import figure_data_uri
from models.decoding import make_decoder
from models.translator_attention import alignment_maps
from pipelines.run_report import image_html
from pipelines.run_report import learning_curves_figure
from pipelines.run_report import table_html


def examples_html(examples):
    rows = "".join(
        f"<tr><td>{number}</td><td>{html.escape(e['source'])}</td><td>{html.escape(e['translation'])}</td>"
        f"<td>{html.escape(e['reference'])}</td></tr>"
        for number, e in enumerate(examples, start=1)
    )
    return f"<table><tr><th></th><th>source</th><th>translation</th><th>reference</th></tr>{rows}</table>"


def search_rows(summary):
    """One row per decoding: BLEU and chrF against all references and per pair, and its time."""
    return [
        (
            f"{name} (beam {result['beam_size']}, length penalty {result['length_penalty']})",
            f"BLEU {result['bleu']} (single reference {result['bleu_single_reference']}), "
            f"chrF {result['chrf']} (single reference {result['chrf_single_reference']}), "
            f"{result['decoding_seconds']} s",
        )
        for name, result in ((name, summary[name]) for name in ("greedy", "beam") if name in summary)
    ]


def report_html(summary, history, example_maps):
    """The page: `summary` of `train_translator`, its epoch rows, and `example_maps` per example."""
    test_set = summary["test_set"]
    figures = [
        (
            "test BLEU",
            f"{summary['test_bleu']} on {summary['bleu_sentences']:,} sentences (beam {summary['beam_size']})",
        ),
        (
            "test set",
            f"{test_set['sources']:,} source sentences ({summary['split']['method']}-disjoint split), "
            f"{test_set['pairs']:,} references",
        ),
        *search_rows(summary),
        ("BLEU signature", summary["bleu_signature"]),
        ("chrF signature", summary["chrf_signature"]),
        ("test token accuracy", f"{summary['test_token_accuracy']:.4f}"),
        ("self-attention", summary["model"]["attention"]),
        ("epochs", summary["epochs_run"]),
        ("training seconds", summary["training_seconds"]),
    ]
    sections = ["<h2>Results</h2>", table_html(figures, ("", "value"))]
    if history:
        sections += [
            "<h2>Learning curves</h2>",
            image_html(figure_data_uri(learning_curves_figure(history)), "learning curves"),
        ]
    sections += ["<h2>Example test sentences</h2>", examples_html(summary["examples"])]
    maps = [
        dataclasses.replace(m, name=f"{number}. {example['source']} | {m.name}")
        for number, (example, sentence_maps) in enumerate(zip(summary["examples"], example_maps), start=1)
        for m in sentence_maps
    ]
    subtitle = f"{summary['data']['source']} → {summary['data']['target']}; cross-attention of each example below"
    return explorer_html(maps, title="Translator run report", subtitle=subtitle, extra_html="\n".join(sections))


def write_report(path, summary, history, model, vectorizers):
    """Writes the report of a finished run (alignments decoded with the run's beam size)."""
    decoder = make_decoder(model, vectorizers, beam_size=summary["beam_size"], length_penalty=summary["length_penalty"])
    example_maps = []
    for example in summary["examples"]:
        target_ids = decoder(vectorizers.source_ids([example["source"]])).numpy()[0]
        example_maps.append(alignment_maps(model, vectorizers, example["source"], target_ids))
    write_text_atomic(path, report_html(summary, history, example_maps))
    return path
