"""The IMDB classifier's test accuracy over several seeds: each branch's mean and spread.

The main job's own run (seed `--seed`) is the one exported; `train_other_seeds` trains the
classifier again with the same flags and seeds `--seed + 1`, `--seed + 2`, ... into
`<output-dir>/seeds/<seed>/` (each resumes like any run), and `seed_spread` summarises the test
accuracy of the ensemble and of each branch alone over all of them.
"""

import argparse
from pathlib import Path

import numpy as np

from models.sentiment_classifier import BRANCHES
from pipelines import train_imdb

SEEDS_DIRECTORY = "seeds"


def seed_run_directory(output_dir, seed):
    return Path(output_dir) / SEEDS_DIRECTORY / str(seed)


def train_other_seeds(args, count):
    """The summaries of `count - 1` more runs of `train_imdb` with the flags `args` and the next seeds."""
    summaries = []
    for seed in range(args.seed + 1, args.seed + count):
        seed_args = argparse.Namespace(
            **{**vars(args), "seed": seed, "output_dir": str(seed_run_directory(args.output_dir, seed))}
        )
        summaries.append(train_imdb.train(seed_args).summary)
    return summaries


def _statistics(values):
    values = np.asarray(values, np.float64)
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,  # sample standard deviation
        "min": float(values.min()),
        "max": float(values.max()),
        "values": [float(value) for value in values],
    }


def seed_spread(summaries):
    """`{"seeds", "ensemble", <branch>...}`: each a dict of mean, std, min, max and the per-seed values.

    Args:
        summaries: `train_imdb` summaries (each with its `seed`, `test_accuracy` and
            `test_accuracy_by_branch`), the exported run's first.
    """
    spread = {"seeds": [summary["seed"] for summary in summaries]}
    spread["ensemble"] = _statistics([summary["test_accuracy"] for summary in summaries])
    for branch in BRANCHES:
        spread[branch] = _statistics([summary["test_accuracy_by_branch"][branch] for summary in summaries])
    return spread
