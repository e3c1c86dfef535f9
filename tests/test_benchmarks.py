"""Each benchmark script's `main` runs end to end with `--smoke` (tiny sizes), so none can rot.

Every script of benchmarks/ is found here (a new benchmark is one module, declaring its
`PEER_RATIO`, smoke-run without an edit), except the multi-worker one, whose worker clusters
must not run beside the distributed tests' (a port freed by one can be taken by the other):
tests/test_distributed.py smoke-runs it, in the same file, so one after the other.
"""

import argparse
import importlib
import json

import pytest

from benchmarks import benchmark_scripts
from benchmarks import float32_logits
from benchmarks import run_all
from benchmarks import sparse_patterns
from tests.benchmark_smoke import assert_smoke_run

SMOKE_RUN_BESIDE_THE_DISTRIBUTED_TESTS = "multi_worker"  # tests/test_distributed.py


def test_the_benchmark_scripts_are_found():
    assert {"layer_throughput", "serving_latency", "convert_speed", SMOKE_RUN_BESIDE_THE_DISTRIBUTED_TESTS} <= set(
        benchmark_scripts()
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [name for name in benchmark_scripts() if name != SMOKE_RUN_BESIDE_THE_DISTRIBUTED_TESTS]
)
def test_smoke_run_writes_rows_with_the_peer_ratio(
    name, tmp_path, monkeypatch, capsys, small_imdb_archive, imdb_cache_dir
):
    assert_smoke_run(name, tmp_path, capsys, monkeypatch, small_imdb_archive, imdb_cache_dir)


def test_sparse_patterns_update_replaces_only_the_points_run(tmp_path):
    def row(case, length, seconds):
        return {"case": case, "mode": "forward", "length": length, "seconds": seconds}

    path = tmp_path / "sparse_patterns.json"
    old_rows = [row("dense_causal", 4096, 1.0), row("causal_strided", 4096, 2.0), row("block_local", 4096, 3.0)]
    path.write_text(json.dumps({"config": {"lengths": [4096]}, "rows": old_rows}))
    payload = {
        "config": {"cases": ["causal_strided"]},
        "rows": [row("causal_strided", 4096, 0.5), row("causal_strided", 8192, 4.0)],
    }

    updated = sparse_patterns._updated(str(path), payload, "2026-01-01 00:00 UTC")

    assert updated["config"] == {"lengths": [4096]}
    assert updated["updates"] == [{"config": {"cases": ["causal_strided"]}, "run_finished_utc": "2026-01-01 00:00 UTC"}]
    assert [(r["case"], r["length"], r["seconds"]) for r in updated["rows"]] == [
        ("dense_causal", 4096, 1.0),
        ("causal_strided", 4096, 0.5),
        ("block_local", 4096, 3.0),
        ("causal_strided", 8192, 4.0),
    ]


def test_make_bench_runs_each_script_and_writes_its_table_and_plot(tmp_path):
    assert run_all.main(["--smoke", "--only", "float32_logits", "--results-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "float32_logits.json").read_text())["rows"]
    summary = (tmp_path / "summary.md").read_text()
    assert "ran 1 scripts" in summary and run_all.table(rows, float32_logits.PEER_RATIO) in summary
    assert (tmp_path / "float32_logits.png").read_bytes().startswith(b"\x89PNG")


def test_make_bench_tables_show_the_goal_fields_after_the_ratio():
    rows = [
        {"model": "float", "ratio": 1.0, "accuracy": 0.91234, "ms": 1003.2},
        {"model": "int8", "ratio": 0.5, "accuracy": None, "ms": 7.0},
    ]
    assert run_all.table(rows, "ratio", ("accuracy", "ms")).splitlines() == [
        "| model | ratio | accuracy | ms |",
        "| --- | --- | --- | --- |",
        "| float | 1.00 | 0.912 | 1,003 |",
        "| int8 | 0.50 | - | 7 |",
    ]


def test_make_bench_replaces_only_its_generated_section():
    first = run_all.replace_generated_section("# Benchmarks\n\nprose\n", "old table\n")
    second = run_all.replace_generated_section(first + "\nlater prose\n", "new table\n")
    assert second.startswith("# Benchmarks\n\nprose\n") and second.endswith("\nlater prose\n")
    assert "new table" in second and "old table" not in second


class _Parsed(Exception):
    """Raised in place of running a script, once its command line has been parsed."""


@pytest.mark.parametrize("name", benchmark_scripts())
def test_make_bench_arguments_are_accepted_by_their_script(name, monkeypatch):
    # `make bench` passes each script its BENCH_ARGS: a flag its parser rejects would fail that
    # script only at the end of a 20-minute run. The parser stops here, before anything runs.
    arguments = list(getattr(importlib.import_module(f"benchmarks.{name}"), "BENCH_ARGS", []))
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise _Parsed(original(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as parsed:
        importlib.import_module(f"benchmarks.{name}").main(arguments)
    assert not parsed.value.args[0].smoke
