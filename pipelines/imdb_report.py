"""`runs/imdb/report.html`: one self-contained page per main-job run.

The headline figures (test accuracy per branch, timing, export parity, the int8 model's accuracy check), the
attention branch's ablation (`pipelines.imdb_ablation`) under this run's figures, the learning curves of
the training history, the confusion matrix on the test split, and what the attention branch
looked at in a few test reviews, right and wrong: their tokens shaded by the attention received,
and the explorer (every review, block and head). Figures are inline PNGs, data and script inline.
"""

import dataclasses

import keras
import numpy as np

from appkit.files import write_text_atomic
from keras_attn.visualization import explorer_html
from keras_attn.visualization import figure_data_uri
from keras_attn.visualization import token_highlight_html
from models.review_attention import explain_review
from models.sentiment_classifier import BRANCHES
from pipelines import imdb_ablation
from pipelines import imdb_data
from pipelines.run_report import image_html
from pipelines.run_report import learning_curves_figure
from pipelines.run_report import table_html

EXAMPLES_PER_OUTCOME = 2  # right and wrong test reviews shown
EXAMPLE_POOL = 400  # the first test reviews they are picked from
EXAMPLE_MAX_WORDS = 160  # short enough to read


def test_predictions(model, test_ids, batch_size, max_tokens):
    """`(probabilities, labels)` of every test review."""
    probabilities, labels = [], []
    for ids, label in imdb_data.batched(test_ids, batch_size, max_tokens):
        probabilities.append(keras.ops.convert_to_numpy(model(ids, training=False))[:, 0])
        labels.append(np.asarray(label))
    return np.concatenate(probabilities), np.concatenate(labels)


def confusion_matrix(probabilities, labels):
    """`[[true negatives, false positives], [false negatives, true positives]]` at 0.5."""
    predicted = (probabilities >= 0.5).astype(int)
    matrix = np.zeros((2, 2), int)
    np.add.at(matrix, (np.asarray(labels, int), predicted), 1)
    return matrix


def confusion_figure(matrix):
    from matplotlib import pyplot

    figure, ax = pyplot.subplots(figsize=(4, 3.6), layout="constrained")
    ax.imshow(matrix, cmap="Blues")
    for (row, column), count in np.ndenumerate(matrix):
        ax.text(
            column, row, f"{count:,}", ha="center", va="center", color="black" if count < matrix.max() / 2 else "white"
        )
    ax.set_xticks([0, 1], ["negative", "positive"])
    ax.set_yticks([0, 1], ["negative", "positive"])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    return figure


def example_reviews(model, vectorizer, config, reviews):
    """Up to `EXAMPLES_PER_OUTCOME` right and wrong reviews among `reviews` `[(text, label)]`, explained."""
    chosen = {True: [], False: []}
    for text, label in reviews:
        if len(text.split()) > EXAMPLE_MAX_WORDS:
            continue
        explained = explain_review(model, vectorizer, config, text)
        right = (explained.probability >= 0.5) == bool(label)
        if explained.tokens and len(chosen[right]) < EXAMPLES_PER_OUTCOME:
            chosen[right].append((text, int(label), explained))
        if all(len(found) == EXAMPLES_PER_OUTCOME for found in chosen.values()):
            break
    return [(right, *example) for right in (True, False) for example in chosen[right]]


def seed_spread_html(seeds):
    """The test accuracy of the ensemble and of each branch over the seeds: mean ± std, range, values."""
    if not seeds:
        return []
    rows = [
        (
            name,
            f"{100 * seeds[name]['mean']:.2f} % ± {100 * seeds[name]['std']:.2f}",
            f"{100 * seeds[name]['min']:.2f} – {100 * seeds[name]['max']:.2f} %",
            ", ".join(f"{100 * value:.2f}" for value in seeds[name]["values"]),
        )
        for name in ("ensemble", *BRANCHES)
    ]
    seed_list = ", ".join(str(seed) for seed in seeds["seeds"])
    return [
        f"<h2>Test accuracy over {len(seeds['seeds'])} seeds ({seed_list})</h2>",
        table_html(rows, ("", "mean ± std", "range", "per seed")),
    ]


def ablation_html(summary):
    """This run's attention branch and ensemble above the measured variants of `pipelines.imdb_ablation`."""
    seeds = summary.get("seeds")
    over_seeds = (
        ""
        if not seeds
        else (
            f"over {len(seeds['seeds'])} seeds: attention {100 * seeds['attention']['mean']:.2f} % "
            f"± {100 * seeds['attention']['std']:.2f}, ensemble {100 * seeds['ensemble']['mean']:.2f} % "
            f"± {100 * seeds['ensemble']['std']:.2f}"
        )
    )
    this_run = (
        f"this run (seed {summary['seed']})",
        f"{100 * summary['test_accuracy_by_branch']['attention']:.2f} %",
        f"{100 * summary['test_accuracy']:.2f} %",
        over_seeds,
    )
    return [
        "<h2>Ablation of the attention branch (test accuracy; the rows below it measured once each)</h2>",
        table_html([this_run, *map(imdb_ablation.cells, imdb_ablation.ROWS)], imdb_ablation.HEADER),
    ]


def report_html(summary, history, matrix, examples):
    """The page. `summary` is the main job's; `history` the epoch rows; `examples` from `example_reviews`."""
    headline = [
        ("test accuracy (ensemble)", f"{summary['test_accuracy']:.4f}"),
        *(
            (f"test accuracy ({branch} branch)", f"{value:.4f}")
            for branch, value in summary["test_accuracy_by_branch"].items()
        ),
        ("validation accuracy", f"{summary['validation_accuracy']:.4f}"),
        ("attention family", summary["attention"]),
        ("epochs", summary["epochs_run"]),
        ("training seconds", summary["training_seconds"]),
        ("training examples / s", summary["train_examples_per_second"]),
    ]
    parity = summary.get("exports", {}).get("parity", {})
    parity_rows = [(name, f"{value:.2e}") for name, value in parity.items() if name.endswith("max_abs_diff")]
    sections = [
        "<h2>Results</h2>",
        table_html(headline, ("", "value")),
        *seed_spread_html(summary.get("seeds")),
        *ablation_html(summary),
        "<h2>Export parity (max abs difference of the probability)</h2>",
        table_html(parity_rows, ("export", f"on {parity.get('reviews', 0)} test reviews"))
        if parity_rows
        else "<p>no export in this run</p>",
    ]
    int8 = summary.get("exports", {}).get("int8")
    if int8:  # checked by accuracy: its rounded weights cannot keep the parity above
        sections += [
            "<h2>int8 ONNX model (checked by accuracy, not parity)</h2>",
            table_html(
                [
                    ("float Keras model accuracy", f"{int8['float_keras_accuracy']:.4f}"),
                    ("int8 ONNX model accuracy", f"{int8['int8_onnx_accuracy']:.4f}"),
                    ("points lost", f"{int8['points_lost']:.2f} (at most {int8['tolerance_points']:g})"),
                    ("float ONNX bytes", f"{int8['float_onnx_bytes']:,}"),
                    ("int8 ONNX bytes", f"{int8['int8_onnx_bytes']:,} ({int8['size_ratio']:.2f}x)"),
                ],
                ("", f"on {int8['reviews']:,} validation reviews"),
            ),
        ]
    if history:
        sections += [
            "<h2>Learning curves</h2>",
            image_html(figure_data_uri(learning_curves_figure(history)), "learning curves"),
        ]
    sections += [
        f"<h2>Confusion matrix ({int(matrix.sum()):,} test reviews)</h2>",
        image_html(figure_data_uri(confusion_figure(matrix)), "confusion matrix"),
        "<h2>What the attention branch looked at</h2>",
    ]
    maps = []
    for number, (right, _text, label, explained) in enumerate(examples, start=1):
        verdict = "right" if right else "wrong"
        caption = f"Review {number} ({verdict}): label {'positive' if label else 'negative'}, p(positive) = {explained.probability:.4f}"
        sections.append(token_highlight_html(explained.tokens, explained.received, title=caption))
        maps += [dataclasses.replace(m, name=f"review {number} ({verdict}) | {m.name}") for m in explained.maps]
    subtitle = f"data: {summary['data'].get('source', '')}; test reviews: {summary['data'].get('test', '')}"
    return explorer_html(maps, title="IMDB main job report", subtitle=subtitle, extra_html="\n".join(sections))


def write_report(path, summary, history, model, vectorizer, config, test_reviews, batch_size=64):
    """Writes the report of a finished run to `path`; returns the confusion matrix.

    Args:
        test_reviews: the test split, a dataset of `(text, label)`.
    """
    test_ids = imdb_data.token_ids(test_reviews, vectorizer, config.max_tokens)
    matrix = confusion_matrix(*test_predictions(model, test_ids, batch_size, config.max_tokens))
    pool = [(text.decode("utf-8"), label) for text, label in test_reviews.take(EXAMPLE_POOL).as_numpy_iterator()]
    page = report_html(summary, history, matrix, example_reviews(model, vectorizer, config, pool))
    write_text_atomic(path, page)
    return matrix
