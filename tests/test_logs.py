"""`appkit.logs`: known-harmless framework lines are dropped only inside the block, only them; an app run
directly prints none of TensorFlow's start-up lines."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from appkit.logs import dropping_log_messages

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_only_the_named_lines_are_dropped_and_only_inside_the_block(caplog):
    logger = logging.getLogger("tests.logs")
    with caplog.at_level(logging.WARNING, logger="tests.logs"):
        with dropping_log_messages("tests.logs", "known noise", "other noise"):
            logger.warning("known noise: dropped")
            logger.warning("other noise: dropped")
            logger.warning("a real problem: shown")
        logger.warning("known noise: shown outside the block")
    assert [record.getMessage() for record in caplog.records] == [
        "a real problem: shown",
        "known noise: shown outside the block",
    ]


@pytest.mark.parametrize("app", ["pipelines.train_translator", "benchmarks.layer_throughput"])
def test_an_app_run_directly_prints_no_tensorflow_start_up_lines(app):
    """`python -m <app>` without `TF_CPP_MIN_LOG_LEVEL` in the environment (as a user runs it, not
    through make): the CUDA probe's and absl's start-up lines never reach the user."""
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    run = subprocess.run(
        [sys.executable, "-m", app, "--help"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout
    noise = [line for line in run.stderr.splitlines() if re.search(r"cuda|absl|^[IWE]\d{4} ", line, re.IGNORECASE)]
    assert noise == []
