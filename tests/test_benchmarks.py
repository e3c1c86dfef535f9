"""Each benchmark script's `main` runs end to end with `--smoke` (tiny sizes), so none can rot.

These check that the scripts run and write their JSON with the peer measured; the figures
themselves are not tested (no timed tests): see BENCHMARKS.md.
"""

import json

import pytest

from benchmarks import cached_decoding
from benchmarks import export_latency
from benchmarks import imdb_attention_families
from benchmarks import imdb_training_throughput
from benchmarks import layer_throughput
from benchmarks import memory_scaling
from tests.imdb_fixtures import imdb_cache_dir  # noqa: F401
from tests.imdb_fixtures import small_imdb_archive  # noqa: F401

SCRIPTS = {
    "layer_throughput": (layer_throughput, "speedup_vs_keras_best"),
    "memory_scaling": (memory_scaling, "memory_vs_keras"),
    "cached_decoding": (cached_decoding, "recompute_over_cached"),
    "export_latency": (export_latency, "onnx_over_saved_model"),
    "imdb_training_throughput": (imdb_training_throughput, "speedup_vs_keras"),
    "imdb_attention_families": (imdb_attention_families, "accuracy_vs_dense"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_smoke_run_writes_rows_with_the_peer_ratio(name, tmp_path, monkeypatch, small_imdb_archive, imdb_cache_dir):
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
