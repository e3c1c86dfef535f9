"""`explain`: which tokens the IMDB classifier attends to in a review, and its predicted probability.

    python -m pipelines.explain_imdb --run runs/imdb "A moving film, wonderfully acted."
    python -m pipelines.explain_imdb --run runs/imdb --output review.html < review.txt

Prints the probability and the most attended tokens. `--output page.html` writes an offline page
(the review's tokens shaded by the attention they receive, and the explorer: every encoder block
and head, hover for a weight, click a row to focus a query); `--output review.png` writes every
head of every block. `--run` is a training output directory (`summary.json`, `vocabulary.txt`,
`best.weights.h5`; the main job's `runs/imdb`).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from appkit.cli import add_debug_flag
from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from appkit.files import reading
from models import imdb_text
from models.export_manifest import check_vocabulary_size
from models.review_attention import explain_review
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import training_model
from models.vocabulary import FIRST_TOKEN_ID
from models.vocabulary import read_vocabulary
from pipelines import resumable_training

OUTPUT_SUFFIXES = (".html", ".png")


def load_classifier(run_dir):
    """`(model, vectorizer, config)` of a finished IMDB training run: the best weights and the fitted ensemble."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ValueError(
            f"`run_dir` holds no summary.json (a finished training run). Received: run_dir={str(run_dir)!r}"
        )
    retrain = f"train the classifier again into {run_dir} (python -m pipelines.train_imdb --output-dir {run_dir})"
    with reading(summary_path, retrain):
        summary = json.loads(summary_path.read_text())
        config = SentimentClassifierConfig.from_dict(summary["model"])
    vocabulary = read_vocabulary(run_dir / "vocabulary.txt")
    check_vocabulary_size(run_dir / "vocabulary.txt", FIRST_TOKEN_ID + len(vocabulary), config.vocabulary_size)
    vectorizer = imdb_text.review_vectorizer(config.vocabulary_size, vocabulary=vocabulary)
    model = build_sentiment_classifier(config)
    with reading(run_dir / resumable_training.BEST_WEIGHTS, retrain):
        training_model(model).load_weights(str(run_dir / resumable_training.BEST_WEIGHTS))
    ensemble = summary["ensemble_weights"]
    model.get_layer("ensemble").set_weights(
        [np.asarray(ensemble["kernel"], "float32").reshape(-1, 1), np.asarray([ensemble["bias"]], "float32")]
    )
    return model, vectorizer, config


def review_page(explained, title, subtitle):
    """The explanation page: the token highlight, then the explorer of every block and head."""
    from keras_attn.visualization import explorer_html
    from keras_attn.visualization import token_highlight_html

    highlight = token_highlight_html(explained.tokens, explained.received)
    return explorer_html(explained.maps, title=title, subtitle=subtitle, extra_html=highlight)


def write_explanation(path, explained, text):
    """Writes `explained` as a page (.html) or a figure of every block and head (.png)."""
    from keras_attn import visualization

    subtitle = f"p(positive) = {explained.probability:.4f} — {text[:300]}{'…' if len(text) > 300 else ''}"
    if path.endswith(".png"):
        figure = visualization.plot_model(explained.maps, labelled=True)
        figure.suptitle(f"p(positive) = {explained.probability:.4f}")
        return visualization.save_figure(figure, path)
    Path(path).write_text(review_page(explained, "Why the classifier decided", subtitle), encoding="utf-8")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.explain_imdb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", default="runs/imdb", help="training output directory (default runs/imdb)")
    parser.add_argument("--output", metavar="PATH", help="also write the maps: .html (offline page) or .png")
    parser.add_argument("--top", type=positive_int, default=10, help="most attended tokens printed (default 10)")
    parser.add_argument("review", nargs="?", help="the review (default: read from stdin)")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.output is not None and os.path.splitext(args.output)[1] not in OUTPUT_SUFFIXES:
        parser.error(f"--output must end in .html or .png, got {args.output!r}")
    with user_errors_exit(parser.prog, args.debug):  # a missing run or unwritable --output: one line, exit 2
        if args.output is not None:
            require_writable_directory(Path(args.output).parent, "--output's directory")
        # Bytes from stdin, as the SavedModel takes them: a review need not be UTF-8.
        text = args.review if args.review is not None else sys.stdin.buffer.read()
        model, vectorizer, config = load_classifier(args.run)
        explained = explain_review(model, vectorizer, config, text)
    print(f"p(positive) = {explained.probability:.4f}")
    if not explained.tokens:
        print("no token of the review is in the vocabulary's reach: nothing was attended to")
        return explained
    for token, weight in explained.top_tokens(args.top):
        print(f"{weight:.4f}  {token}")
    if args.output is not None:
        shown = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        print(f"wrote {write_explanation(args.output, explained, shown)}")
    return explained


if __name__ == "__main__":
    main(sys.argv[1:])
