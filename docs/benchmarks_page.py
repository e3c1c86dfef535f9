"""MkDocs hook: the site's measured figures, made at build time from `benchmarks/results`.

- `benchmarks.md`: the summary of the latest `make bench` run, the one `benchmarks/run_all.py`
  wrote (`summary.md` beside the results, also BENCHMARKS.md's generated section), with each
  script's plot shown under its table;
- in a guide, the line `<!-- measured: attention families vs length -->` becomes the table of
  `benchmarks/results/attention_families_scaling.json` (the run BENCHMARKS.md discusses): the
  memory and time of a forward and backward pass per family and length.
"""

import json
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # `mkdocs build -f` from another directory

from benchmarks import run_all  # noqa: E402  (needs the path above; imports no TensorFlow)

PAGE = "benchmarks.md"
FAMILIES_MARKER = "<!-- measured: attention families vs length -->"
FAMILIES_RESULT = REPO_ROOT / "benchmarks" / "results" / "attention_families_scaling.json"
INTRO = f"""# Benchmarks

The latest run of every benchmark script by `make bench` (`benchmarks/run_all.py`), made into
this page when the site is built. Each row's ratio is against a peer measured in the same run on
the same machine (the column named `..._vs_...`; below 1 is better where it is a time or a
memory); the plot under each table draws that ratio, 1.0 marked. The conditions, the targets and
the discussion of each figure are in the repository's `BENCHMARKS.md`; the JSON of every run is in
`{run_all.shown_path(run_all.RESULTS_DIR)}`.

"""


def plot_uri(name):
    return f"benchmarks/{name}.png"


def breakable_headers(markdown):
    """`markdown` with a line-break opportunity after each `_` of its tables' header rows, so that
    a column named `speedup_vs_keras_same_jit` can be narrower than its name."""
    return re.sub(r"(?m)^(\|.*\|)(?=\n\|(?: -+ \|)+$)", lambda header: header[1].replace("_", "_<wbr>"), markdown)


def benchmarks_markdown(summary, plotted):
    """The page: `summary` (run_all's, one `### `name` (seconds)` section per script) under the
    page's own title, each section ending with the plot of the scripts in `plotted`."""
    head, *sections = re.split(r"(?m)^### ", summary)
    parts = [INTRO, head]
    for section in sections:
        name = re.match(r"`(\w+)`", section)[1]
        parts.append(f"## {section.rstrip()}\n\n")
        if name in plotted:
            parts.append(f"![{name}: the ratio to its peer per row]({plot_uri(name)})\n\n")
    return breakable_headers("".join(parts))


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
        f"`{run_all.shown_path(FAMILIES_RESULT)}`.",
        "",
    ]
    lines += [f"- `{row['case']}` at {row['length']:,} tokens {row['status']}" for row in rows if row["status"] != "ok"]
    return "\n".join(lines) + "\n"


def _cell(row):
    return f"{row['call_gb']:.2f} GB, {row['seconds']:.1f} s" if row["status"] == "ok" else "not run"


def on_files(files, config):
    plots = sorted(run_all.RESULTS_DIR.glob("*.png"))
    for path in plots:
        files.append(File.generated(config, plot_uri(path.stem), abs_src_path=str(path)))
    summary = (run_all.RESULTS_DIR / "summary.md").read_text(encoding="utf-8")
    files.append(File.generated(config, PAGE, content=benchmarks_markdown(summary, {path.stem for path in plots})))
    return files


def on_page_markdown(markdown, page, config, files):
    if FAMILIES_MARKER in markdown:
        result = json.loads(FAMILIES_RESULT.read_text(encoding="utf-8"))
        markdown = markdown.replace(FAMILIES_MARKER, families_table(result))
    return markdown
