"""Each benchmark script's `main` runs end to end with `--smoke` (tiny sizes), so none can rot.

These check that the scripts run and write their JSON with the peer measured; the figures
themselves are not tested (no timed tests): see BENCHMARKS.md.
"""

import json

import pytest

from benchmarks import attention_families_scaling
from benchmarks import cached_decoding
from benchmarks import serving_latency
from benchmarks import float32_logits
from benchmarks import imdb_attention_families
from benchmarks import imdb_training_throughput
from benchmarks import int8_quantization
from benchmarks import layer_throughput
from benchmarks import memory_scaling
from benchmarks import position_bias_memory
from benchmarks import sparse_patterns
from tests.imdb_fixtures import imdb_cache_dir  # noqa: F401
from tests.imdb_fixtures import small_imdb_archive  # noqa: F401

SCRIPTS = {
    "attention_families_scaling": (attention_families_scaling, "time_vs_peer"),
    "layer_throughput": (layer_throughput, "speedup_vs_keras_best"),
    "memory_scaling": (memory_scaling, "memory_vs_keras"),
    "position_bias_memory": (position_bias_memory, "memory_vs_no_bias"),
    "cached_decoding": (cached_decoding, "recompute_over_cached"),
    "serving_latency": (serving_latency, "p50_vs_keras"),
    "float32_logits": (float32_logits, "float32_over_float16"),
    "imdb_training_throughput": (imdb_training_throughput, "speedup_vs_keras"),
    "imdb_attention_families": (imdb_attention_families, "accuracy_vs_dense"),
    "int8_quantization": (int8_quantization, "batch32_vs_float"),
    "sparse_patterns": (sparse_patterns, "speedup_vs_dense_causal"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_smoke_run_writes_rows_with_the_peer_ratio(name, tmp_path, monkeypatch, capsys, small_imdb_archive, imdb_cache_dir):
    # The IMDB benchmarks read the small test archive through the pipelines' cache.
    monkeypatch.setenv("KERAS_ATTN_DATA", str(small_imdb_archive))
    monkeypatch.setenv("KERAS_ATTN_CACHE", str(imdb_cache_dir))
    module, ratio = SCRIPTS[name]
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
