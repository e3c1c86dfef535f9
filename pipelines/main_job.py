"""The project's main job: IMDB reviews -> trained classifier -> verified SavedModel + ONNX.

    python -m pipelines.main_job [--export-dir artifacts/export] [any pipelines.train_imdb flag]

Trains with the default configuration on the shipped data (`pipelines.train_imdb`), evaluates on
the official test split, trains `--seeds` - 1 more seeds with the same flags for the accuracy's
spread (`pipelines.imdb_seeds`; the first seed's model is the one exported), exports the SavedModel (TF Serving layout) and the ONNX bundle, verifies
both against the Keras model on real test reviews of varied lengths (`export.imdb.verified_export`), checks the
bundle's int8 model by its accuracy on the validation slice against the Keras model's, and prints
a final summary: test accuracy, training time, export paths, parity figures, the int8 check. The summary is also
written to `<output-dir>/main_job.json`, beside `<output-dir>/report.html`: a self-contained page
with those figures, the learning curves, the test confusion matrix and the attention maps of a
few test reviews, right and wrong (`pipelines.imdb_report`).
"""

import argparse
import json
import sys
import time

from appkit.cli import positive_int
from appkit.cli import require_writable_directory
from appkit.cli import user_errors_exit
from appkit.files import write_json_atomic
from export import serving_layout
from export.imdb.verified_export import INT8_TOLERANCE_POINTS
from export.imdb.verified_export import export_and_verify
from export.imdb.verified_export import verification_reviews
from pipelines import distributed
from pipelines import encoder_checkpoint
from pipelines import imdb_report
from pipelines import imdb_seeds
from pipelines import resumable_training
from pipelines import train_imdb
from pipelines import training

_VERIFICATION_POOL = 2_000  # test reviews the verification picks its varied lengths from
SMOKE_INT8_TOLERANCE_POINTS = 100.0  # --smoke: the int8 accuracy check reports, the full run enforces
PROG = "python -m pipelines.main_job"


def _model_name(text):
    try:
        return serving_layout.check_model_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv=None):
    """The export's flags and every `pipelines.train_imdb` flag, in one namespace."""
    export_flags = argparse.ArgumentParser(add_help=False)
    export_flags.add_argument("--export-dir", default="artifacts/export", help="root of the TF Serving layout")
    export_flags.add_argument("--model-name", type=_model_name, default="imdb_sentiment")
    export_flags.add_argument(
        "--seeds",
        type=positive_int,
        default=3,
        help="runs with seeds --seed, --seed + 1, ...: the test accuracies' mean and spread (the first is exported)",
    )
    return train_imdb.parse_args(argv, prog=PROG, parents=[export_flags], description=__doc__.split("\n")[0])


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(argv)
    if args.cpu_devices:
        training.split_cpu(args.cpu_devices)  # before TensorFlow initialises its devices
    with user_errors_exit(PROG, args.debug), distributed.exit_when_a_worker_is_lost():
        # Both outputs are proved writable before hours of training, not after.
        require_writable_directory(args.output_dir, "--output-dir")
        require_writable_directory(args.export_dir, "--export-dir")
        run = train_imdb.train(args)
        args.pretrained = encoder_checkpoint.request_as_used(run.summary["pretrained"])  # every seed alike
        seeds = imdb_seeds.seed_spread([run.summary, *imdb_seeds.train_other_seeds(args, args.seeds)])
        write_json_atomic(run.output_dir / "summary.json", {**run.summary, "seeds": seeds})
        if not run.chief:  # another worker of a multi-worker run: the chief exports
            return run.summary
        pool = [text.decode("utf-8") for text, _ in run.splits.test.take(_VERIFICATION_POOL).as_numpy_iterator()]
        # The int8 model's accuracy check runs on held-out training reviews: the test split stays for the final figure.
        validation = [(text.decode("utf-8"), int(label)) for text, label in run.splits.validation.as_numpy_iterator()]
        exports = export_and_verify(
            run.model,
            run.vectorizer,
            run.summary["vocabulary"],
            run.config.max_tokens,
            verification_reviews(pool),
            args.export_dir,
            args.model_name,
            accuracy_reviews=[text for text, _ in validation],
            accuracy_labels=[label for _, label in validation],
            # A smoke run's barely trained model, judged on 64 reviews, moves 1.56 points per review
            # int8 flips: its figures are still computed and reported; the tolerance is the full run's.
            int8_tolerance=SMOKE_INT8_TOLERANCE_POINTS if args.smoke else INT8_TOLERANCE_POINTS,
        )
    summary = {
        "test_accuracy": run.summary["test_accuracy"],
        "seed": run.summary["seed"],
        "attention": run.config.attention,
        "test_accuracy_by_branch": run.summary["test_accuracy_by_branch"],
        "seeds": seeds,
        "validation_accuracy": run.summary["validation_accuracy"],
        "training_seconds": run.summary["training_seconds"],
        "epochs_run": run.summary["epochs_run"],
        "train_examples_per_second": run.summary["train_examples_per_second"],
        "data": run.summary["data"],
        "exports": exports,
        "training_summary": str(run.output_dir / "summary.json"),
        "report": str(run.output_dir / "report.html"),
    }
    report_started = time.perf_counter()
    imdb_report.write_report(
        run.output_dir / "report.html",
        summary,
        resumable_training.read_history(run.output_dir),
        run.model,
        run.vectorizer,
        run.config,
        run.splits.test,
    )
    summary["report_seconds"] = round(time.perf_counter() - report_started, 1)
    summary["main_job_seconds"] = round(time.perf_counter() - started, 1)
    write_json_atomic(run.output_dir / "main_job.json", summary)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
