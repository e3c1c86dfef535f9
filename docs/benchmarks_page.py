"""MkDocs hook: the site's measured figures, made at build time from `benchmarks/results`.

- `benchmarks.md`: the benchmarks page, made by `benchmarks.page` from the results of `make
  bench` (`benchmarks/results/make_bench/`), the same Markdown as the repository's BENCHMARKS.md,
  with each script's plot (written there by `make bench`) copied into the site;
- in a guide, the line `<!-- measured: attention families vs length -->` becomes the table of
  `benchmarks/results/attention_families_scaling.json`: the memory and time of a forward and
  backward pass per family and length.
"""

import json
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # `mkdocs build -f` from another directory

from benchmarks import page as results_page  # noqa: E402  (needs the path above)

PAGE = "benchmarks.md"
FAMILIES_MARKER = "<!-- measured: attention families vs length -->"
FAMILIES_RESULT = REPO_ROOT / "benchmarks" / "results" / "attention_families_scaling.json"


def plot_uri(name):
    return f"benchmarks/{name}.png"


def breakable_headers(markdown):
    """`markdown` with a line-break opportunity after each `_` of its tables' header rows, so that
    a column named `speedup_vs_keras_same_jit` can be narrower than its name."""
    return re.sub(r"(?m)^(\|.*\|)(?=\n\|(?: -+ \|)+$)", lambda header: header[1].replace("_", "_<wbr>"), markdown)


def benchmarks_markdown(results_dir=results_page.RESULTS_DIR):
    """The site's page: BENCHMARKS.md's Markdown, its plots at `plot_uri`."""
    plotted = {path.stem for path in results_dir.glob("*.png")}
    return breakable_headers(
        results_page.page_markdown(results_dir, lambda name: plot_uri(name) if name in plotted else None)
    )


def families_table(result, mode="forward_backward"):
    """Markdown: per family (rows) and length (columns), the call's own memory and its time in
    `mode`, "not run" where a step was not started, its reason listed under the table."""
    rows = [row for row in result["rows"] if row["mode"] == mode]
    lengths = sorted({row["length"] for row in rows})
    cases = list(dict.fromkeys(row["case"] for row in rows))
    cells = {(row["case"], row["length"]): _cell(row) for row in rows}
    lines = ["| family | " + " | ".join(f"{length:,} tokens" for length in lengths) + " |"]
    lines.append("| --- |" + " ---: |" * len(lengths))
    lines += [f"| `{case}` | " + " | ".join(cells.get((case, n), "-") for n in lengths) + " |" for case in cases]
    machine = result["machine"]
    lines += [
        "",
        f"Each cell: the call's own memory and its time, {mode.replace('_', ' + ')}, batch 1; measured "
        f"{machine['time_utc']} UTC on {machine['cpus']} shared cores (load average "
        f"{machine['load_average'][0]:.1f}: read the seconds as orders of magnitude), from "
        f"`{FAMILIES_RESULT.relative_to(REPO_ROOT).as_posix()}`.",
        "",
    ]
    lines += [f"- `{row['case']}` at {row['length']:,} tokens {row['status']}" for row in rows if row["status"] != "ok"]
    return "\n".join(lines) + "\n"


def _cell(row):
    return f"{row['call_gb']:.2f} GB, {row['seconds']:.1f} s" if row["status"] == "ok" else "not run"


def on_files(files, config):
    for path in sorted(results_page.RESULTS_DIR.glob("*.png")):
        files.append(File.generated(config, plot_uri(path.stem), abs_src_path=str(path)))
    files.append(File.generated(config, PAGE, content=benchmarks_markdown()))
    return files


def on_page_markdown(markdown, page, config, files):
    if FAMILIES_MARKER in markdown:
        result = json.loads(FAMILIES_RESULT.read_text(encoding="utf-8"))
        markdown = markdown.replace(FAMILIES_MARKER, families_table(result))
    return markdown
