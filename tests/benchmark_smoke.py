"""One smoke run of a benchmark script (`benchmarks/<name>.py --smoke`), checked the same way wherever it runs.

A script runs end to end with tiny sizes and must write its JSON with the rows it returned, at
least one positive ratio to its peer (`PEER_RATIO`, the row key the module declares) and the
machine's load. The figures themselves are not tested (no timed tests): see BENCHMARKS.md.
"""

import importlib
import json


def assert_smoke_run(name, tmp_path, capsys, monkeypatch, small_imdb_archive, imdb_cache_dir):
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
    # The figures `make bench`'s table shows for the script's goals are fields of its rows.
    for goal in getattr(module, "GOAL_FIELDS", ()):
        assert any(row.get(goal) is not None for row in rows), goal
    # The conditions are the machine's load on its cores, printed and recorded.
    cpus, load = written["machine"]["cpus"], written["machine"]["load_average"]
    assert (
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1, 5, 15 min) on {cpus} cores"
        in capsys.readouterr().out
    )
