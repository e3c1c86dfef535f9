"""Each benchmark script's `main` runs end to end with `--smoke` (tiny sizes), so none can rot.

Every script of benchmarks/ is found here (a new benchmark is one module, declaring its
`PEER_RATIO`, smoke-run without an edit), except the multi-worker one, whose worker clusters
must not run beside the distributed tests' (a port freed by one can be taken by the other):
tests/test_distributed.py smoke-runs it, in the same file, so one after the other.
"""

import argparse
import importlib
import json
import re

import pytest

from benchmarks import benchmark_scripts
from benchmarks import float32_logits
from benchmarks import page
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


def test_make_bench_runs_each_script_and_writes_the_page_from_its_results(tmp_path):
    stale = tmp_path / "float32_logits.old.json"  # a part left by an earlier run: replaced, not shown
    stale.write_text("{}")
    assert run_all.main(["--smoke", "--only", "float32_logits", "--results-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "float32_logits.json").read_text())
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert not stale.exists()
    # The command that reran it, copyable: the script, its arguments, the output relative to the repository.
    assert result["command"].startswith("python -m benchmarks.float32_logits --smoke --output ")
    assert f"`{result['command']}` on " in markdown
    assert f"{result['machine']['cpus']} cores ({result['machine']['cpu_model']})" in markdown
    assert "load average" not in markdown  # it stays in the JSON
    for row in result["rows"]:
        anchor = page.row_anchor("float32_logits", row, ["length"])
        line = next(line for line in markdown.splitlines() if f'id="{anchor}"' in line)
        assert f"| {page.figure(row[float32_logits.PEER_RATIO])} |" in line
    assert (tmp_path / "float32_logits.png").read_bytes().startswith(b"\x89PNG")
    assert "![float32_logits](float32_logits.png)" in markdown


def test_the_page_is_what_make_bench_makes_from_the_results():
    # BENCHMARKS.md is generated: an edit by hand, or results changed without `make bench
    # ARGS=--render-only`, would make it disagree with the JSON files it says it shows.
    assert page.BENCHMARKS_MD.read_text(encoding="utf-8") == page.repository_markdown()
    for name in page.loaded(page.RESULTS_DIR):
        assert page.plot_path(page.RESULTS_DIR, name).is_file(), name


def test_every_result_on_the_page_records_a_command_its_script_accepts(monkeypatch):
    # The page's commands are copied to rerun a figure: each must parse with its script's parser.
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise _Parsed(original(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for path in sorted(page.RESULTS_DIR.glob("*.json")):
        words = json.loads(path.read_text())["command"].split()
        name = path.name.split(".")[0]
        assert words[:3] == ["python", "-m", f"benchmarks.{name}"], path.name
        with pytest.raises(_Parsed):
            importlib.import_module(f"benchmarks.{name}").main(words[3:])


def test_a_recorded_command_names_an_output_inside_the_repository_relative_to_it(tmp_path):
    from benchmarks import measurement

    inside = page.RESULTS_DIR / "layer_throughput.json"
    assert measurement.command("layer_throughput", ["--repeats", "3", "--output", str(inside)]) == (
        "python -m benchmarks.layer_throughput --repeats 3 --output benchmarks/results/make_bench/layer_throughput.json"
    )
    outside = str(tmp_path / "x.json")
    assert measurement.command("float32_logits", ["--output", outside]).endswith(f"--output {outside}")


def test_a_goal_is_met_by_the_rows_it_names_in_the_share_it_asks_for():
    rows = [
        {"model": "a", "length": 512, "ratio": 0.9},
        {"model": "b", "length": 512, "ratio": 1.2},
        {"model": "c", "length": 4096, "ratio": 0.2},
        {"model": "d", "length": 4096},
    ]
    assert page.evaluate(("ratio", "<=", 1.0), rows) == (False, [0.9, 1.2, 0.2], 2)
    assert page.evaluate(("ratio", "<=", 1.0, {}, 0.6), rows) == (True, [0.9, 1.2, 0.2], 2)
    assert page.evaluate(("ratio", "<=", 0.3, {"length": 4096}), rows) == (True, [0.2], 1)
    assert page.evaluate(("ratio", ">=", 1.0, {"model": ["b", "c"]}), rows) == (False, [1.2, 0.2], 1)
    assert page.evaluate(("ratio", "<=", 1.0, {"length": 2048}), rows) == (None, [], 0)
    lines = page.goals_table("s", rows, [("ratio", "<=", 0.3, {"length": 4096}), ("ratio", "<=", 1.0)])
    assert lines.splitlines()[2:] == [
        '| <a id="s-goal-ratio-4096"></a>`ratio` <= 0.3 where length = 4096, in every row | 1 | 0.20 | 1 | met |',
        '| <a id="s-goal-ratio"></a>`ratio` <= 1.0, in every row | 3 | 0.20–1.20 | 2 | **missed** |',
    ]


def test_table_rows_are_anchored_by_what_they_are_once_each():
    rows = [
        {"layer": "keras", "length": 512, "causal": True, "ms": 10.0, "ratio": 1.0, "status": "ok"},
        {"layer": "auto", "length": 512, "causal": False, "ms": 5.0, "ratio": 2.0, "status": "ok"},
        {"layer": "auto", "length": 512, "causal": False, "ms": 5.5, "ratio": 1.8, "status": "over cap"},
    ]
    lines = page.table("t", rows, {"PEER_RATIO": "ratio", "GOAL_FIELDS": ("ms",)}).splitlines()
    assert lines == [
        "| layer | length | causal | status | ratio | ms |",
        "| --- | --- | --- | --- | --- | --- |",
        '| <a id="t-keras-512-causal"></a>keras | 512 | True | ok | 1.00 | 10.00 |',
        '| <a id="t-auto-512-not_causal"></a>auto | 512 | False | ok | 2.00 | 5.00 |',
        '| <a id="t-auto-512-not_causal-2"></a>auto | 512 | False | over cap | 1.80 | 5.50 |',
    ]


def test_a_summary_has_one_line_per_case_and_each_figure_at_each_length():
    rows = [
        {"model": "a", "variant": "keras", "length": 512, "time": 1.0},
        {"model": "a", "variant": "converted", "length": 512, "time": 0.9},
        {"model": "a", "variant": "converted", "length": 2048, "memory": 0.5},
        {"model": "b generate", "variant": "converted", "length": 192, "time": 1.2},
    ]
    summary = (("model",), "length", ("time", "memory"), {"variant": "converted"})
    assert page.summary_table("s", rows, summary).splitlines() == [
        "| model | time at 192 | time at 512 | memory at 2048 |",
        "| --- | --- | --- | --- |",
        '| <a id="s-a"></a>a | - | 0.90 | 0.50 |',
        '| <a id="s-b_generate"></a>b generate | 1.20 | - | - |',
    ]
    with pytest.raises(ValueError, match=r"two rows of \{'model': 'a'\} have time at length 512"):
        page.summary_table("s", rows, (("model",), "length", ("time",), {}))
    with_run = (("run", "model"), "length", ("time", "memory"), {"variant": "converted"})
    assert page.summary_table("s", rows, with_run) == page.summary_table("s", rows, summary)  # no row has a run
    runs = [{**row, "run": "main" if row["model"] == "a" else "again"} for row in rows]
    assert page.summary_table("s", runs, with_run).splitlines()[2:] == [
        '| <a id="s-main-a"></a>main | a | - | 0.90 | 0.50 |',
        '| <a id="s-again-b_generate"></a>again | b generate | 1.20 | - | - |',
    ]


class _Parsed(Exception):
    """Raised in place of running a script, once its command line has been parsed."""


@pytest.mark.parametrize("name", benchmark_scripts())
def test_make_bench_arguments_are_accepted_by_their_script(name, monkeypatch):
    # `make bench` passes each script its BENCH_ARGS (and BENCH_PARTS' with --parts): a flag its
    # parser rejects would fail that script only at the end of a long run. The parser stops here,
    # before anything runs.
    module = importlib.import_module(f"benchmarks.{name}")
    runs = [list(getattr(module, "BENCH_ARGS", [])), *getattr(module, "BENCH_PARTS", {}).values()]
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise _Parsed(original(parser, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for arguments in runs:
        with pytest.raises(_Parsed) as parsed:
            module.main(arguments)
        assert not parsed.value.args[0].smoke


def test_the_site_page_is_the_same_page_with_its_plots_in_the_site():
    from docs import benchmarks_page

    site = benchmarks_page.benchmarks_markdown()
    repository = page.BENCHMARKS_MD.read_text(encoding="utf-8")
    anchors = re.compile(r'<a id="([^"]+)"></a>')
    assert anchors.findall(site) == anchors.findall(repository) != []
    plots = re.findall(r"!\[(\w+)\]\(([^)]+)\)", site)
    assert [name for name, _ in plots] == list(page.loaded(page.RESULTS_DIR))
    for name, uri in plots:  # the hook copies each script's plot to the site at this address
        assert uri == benchmarks_page.plot_uri(name) and page.plot_path(page.RESULTS_DIR, name).is_file()
