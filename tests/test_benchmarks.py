"""Each benchmark script's `main` runs end to end with `--smoke` (tiny sizes), so none can rot.

These check that the scripts run and write their JSON with the peer measured; the figures
themselves are not tested (no timed tests): see BENCHMARKS.md.
"""

import importlib
import json
from pathlib import Path

import pytest

from benchmarks import sparse_patterns
from tests.imdb_fixtures import imdb_cache_dir  # noqa: F401
from tests.imdb_fixtures import small_imdb_archive  # noqa: F401

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
# Every script of benchmarks/ (a module that runs as `python -m benchmarks.<name>`): a new
# benchmark is one module, declaring its `PEER_RATIO`, and is smoke-run here without an edit.
SCRIPTS = sorted(
    path.stem for path in BENCHMARKS_DIR.glob("*.py") if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def test_the_benchmark_scripts_are_found():
    assert {"layer_throughput", "serving_latency", "convert_speed", "multi_worker"} <= set(SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_smoke_run_writes_rows_with_the_peer_ratio(name, tmp_path, monkeypatch, capsys, small_imdb_archive, imdb_cache_dir):
    # The IMDB benchmarks read the small test archive through the pipelines' cache.
    monkeypatch.setenv("KERAS_ATTN_DATA", str(small_imdb_archive))
    monkeypatch.setenv("KERAS_ATTN_CACHE", str(imdb_cache_dir))
    module = importlib.import_module(f"benchmarks.{name}")
    ratio = module.PEER_RATIO  # the row key of the ratio to the peer measured in the same run
    output = tmp_path / f"{name}.json"
    rows = module.main(["--smoke", "--output", str(output)])
    written = json.loads(output.read_text())
    assert written["benchmark"] == f"{name}_smoke"
    assert written["rows"] == json.loads(json.dumps(rows))
    assert any(row.get(ratio) is not None and row[ratio] > 0 for row in rows)
    # The conditions are the machine's load on its cores, printed and recorded.
    cpus, load = written["machine"]["cpus"], written["machine"]["load_average"]
    assert f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1, 5, 15 min) on {cpus} cores" in capsys.readouterr().out


def test_sparse_patterns_update_replaces_only_the_points_run(tmp_path):
    def row(case, length, seconds):
        return {"case": case, "mode": "forward", "length": length, "seconds": seconds}

    path = tmp_path / "sparse_patterns.json"
    old_rows = [row("dense_causal", 4096, 1.0), row("causal_strided", 4096, 2.0), row("block_local", 4096, 3.0)]
    path.write_text(json.dumps({"config": {"lengths": [4096]}, "rows": old_rows}))
    payload = {"config": {"cases": ["causal_strided"]}, "rows": [row("causal_strided", 4096, 0.5), row("causal_strided", 8192, 4.0)]}

    updated = sparse_patterns._updated(str(path), payload, "2026-01-01 00:00 UTC")

    assert updated["config"] == {"lengths": [4096]}
    assert updated["updates"] == [{"config": {"cases": ["causal_strided"]}, "run_finished_utc": "2026-01-01 00:00 UTC"}]
    assert [(r["case"], r["length"], r["seconds"]) for r in updated["rows"]] == [
        ("dense_causal", 4096, 1.0),
        ("causal_strided", 4096, 0.5),
        ("block_local", 4096, 3.0),
        ("causal_strided", 8192, 4.0),
    ]
