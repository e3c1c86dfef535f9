"""The README is the front door: every Python example in it runs as written, each as its own test
named after its section, and it stays short and free of lab notes (those live in the model cards
and on the benchmarks page)."""

import pathlib
import re

import pytest

from benchmarks import page as results_page
from docs import api_pages
from docs import benchmarks_page
from docs import changelog_page
from docs import home_page
from tests.markdown_examples import python_examples
from tests.markdown_examples import run_example
from tests.markdown_examples import self_comparisons

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
FRONT_PAGES = [README, REPO_ROOT / "BENCHMARKS.md", *sorted((REPO_ROOT / "docs" / "guides").glob("*.md"))]
FRONT_PAGES += sorted((REPO_ROOT / "docs" / "models").glob("*.md"))
# A git commit id: 7 to 40 hex digits with at least one digit and one letter.
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
LOAD_AVERAGE = re.compile(r"\bload(?: average)? \d|\bload average\b", re.IGNORECASE)


@pytest.mark.parametrize("code", [pytest.param(code, id=name) for name, code in python_examples(README)])
def test_readme_example_runs(code):
    run_example(code, README)


def test_readme_has_examples_and_fits_the_front_door():
    assert len(python_examples(README)) >= 3
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/ (guides, model cards, benchmarks)"


@pytest.mark.parametrize("page", FRONT_PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_no_commit_ids_or_load_averages_on_the_reading_pages(page):
    text = page.read_text(encoding="utf-8")
    assert not COMMIT_ID.findall(text), f"{page.name} quotes commit ids: {COMMIT_ID.findall(text)}"
    assert not LOAD_AVERAGE.findall(text), f"{page.name} quotes load averages: {LOAD_AVERAGE.findall(text)}"


DOCS = REPO_ROOT / "docs"
MARKDOWN_PAGES = [README, *sorted(DOCS.rglob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"(?ms)^([ \t]*)(```|~~~).*?^\1\2[ \t]*$")


def generated_pages():
    """The docs-relative paths of the pages the site's hooks generate (docs/api_pages.py,
    docs/benchmarks_page.py, docs/changelog_page.py)."""
    generated = {api_pages.API_INDEX, benchmarks_page.PAGE, changelog_page.PAGE}
    return generated | {api_pages.page_path(name) for name in api_pages.public_names()}


def broken_links(page):
    """The relative links of `page` (outside fenced code) that reach no file: README's must name a
    file of the repository; a docs page's may also name a page the site generates."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in _LINK.findall(text):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):
            continue  # an anchor on the page itself, or an external address
        resolved = (page.parent / path).resolve()
        if resolved.is_file():
            continue
        in_docs = resolved.is_relative_to(DOCS) and page != README
        if not (in_docs and resolved.relative_to(DOCS).as_posix() in generated_pages()):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", MARKDOWN_PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_reaches_a_file_of_the_repository_or_a_generated_page(page):
    assert not broken_links(page), f"{page.name}: links to nothing: {broken_links(page)}"


# A code span naming a file under one of the repository's own folders (`tests/test_convert.py`,
# `keras_attn/kernels/streaming_softmax.py`): the evidence a page cites must exist.
_TRACKED_FOLDERS = ("keras_attn", "tests", "benchmarks", "docs", "pipelines", "models", "export", "appkit")
_CITED_FILE = re.compile(rf"`((?:{'|'.join(_TRACKED_FOLDERS)})/[\w/.-]+\.\w+)`")


@pytest.mark.parametrize("page", MARKDOWN_PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_file_a_page_cites_exists(page):
    cited = _CITED_FILE.findall(page.read_text(encoding="utf-8"))
    missing = [path for path in cited if not (REPO_ROOT / path).is_file()]
    assert not missing, f"{page.name} cites files the repository does not have: {missing}"


@pytest.mark.parametrize("page", MARKDOWN_PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_no_example_asserts_that_a_thing_equals_itself(page):
    for name, code in python_examples(page):
        assert not self_comparisons(code), (
            f"{page.name} {name}: lines {self_comparisons(code)} compare a thing with itself"
        )


def test_the_checks_find_a_dead_link_a_comparison_of_a_model_with_itself_and_a_wrong_printed_claim(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](missing.md), [site](https://keras.io), [top](#top)\n")
    assert broken_links(page) == ["missing.md"]
    code = "fast = keras_attn.convert(model)\nnp.testing.assert_allclose(fast(x), model(x))\nassert fast is model\n"
    assert self_comparisons(code) == [2]
    run_example("print([1, 2],\n      'x')  # [1, 2]   x\n", page)  # the claim, whitespace aside
    with pytest.raises(AssertionError, match=r"prints '\[1, 3\]', its comment says '\[1, 2\]'"):
        run_example("for _ in range(1):\n    print([1, 3])  # [1, 2]\n", page)


def test_the_home_page_and_the_navigation_list_every_guide_and_model_card():
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    navigation = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in [*sorted((DOCS / "guides").glob("*.md")), *sorted((DOCS / "models").glob("*.md"))]:
        path = page.relative_to(DOCS).as_posix()
        assert f"]({path})" in home, f"docs/index.md does not link {path}"
        assert f": {path}\n" in navigation, f"mkdocs.yml's nav does not list {path}"
    assert home_page.MARKER in home, "docs/index.md must show the version"


# A figure measured by a benchmark links to its row of the benchmarks page (an anchor the page
# generator puts in the row's first cell): `[1.22x](BENCHMARKS.md#layer_throughput-...)` from the
# README, `[7.49x](../benchmarks.md#sparse_patterns-...)` from a page of the site (the same page).
_FIGURE_LINK = re.compile(r"\[([^\]]+)\]\((?:BENCHMARKS\.md|(?:\.\./)*benchmarks\.md)#([\w.-]+)\)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SECTION = re.compile(r"(?m)^## `(\w+)`$")


def numbers(text):
    """The numbers of `text` (HTML tags left out), thousands separators dropped: `[0.14, 0.77]`."""
    return [float(number.replace(",", "")) for number in _NUMBER.findall(re.sub(r"<[^>]*>", "", text))]


def anchored_rows(markdown):
    """`{anchor: [cell, ...]}` of the table rows of `markdown` whose cells hold `<a id="anchor">`."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("|"):
            for anchor in re.findall(r'<a id="([^"]+)"></a>', line):
                rows[anchor] = [cell.strip() for cell in line.strip().strip("|").split("|")]
    return rows


def figures_not_on_their_rows(text, benchmarks):
    """The links of `text` into the benchmarks page whose anchor is neither a row nor a script's
    section of `benchmarks`, or whose figure is not on its row (its numbers are those of none of
    the row's cells; a section's link holds no figure): `[(figure, anchor, the row's cells or None)]`."""
    rows = anchored_rows(benchmarks)
    sections = set(_SECTION.findall(benchmarks))
    wrong = []
    for figure, anchor in _FIGURE_LINK.findall(text):
        cells = rows.get(anchor)
        if anchor in sections and not numbers(figure):
            continue
        if cells is None or (numbers(figure) and not any(numbers(cell) == numbers(figure) for cell in cells)):
            wrong.append((figure, anchor, cells))
    return wrong


def test_every_readme_figure_links_to_the_benchmarks_row_it_quotes():
    readme = README.read_text(encoding="utf-8")
    assert len(_FIGURE_LINK.findall(readme)) >= 10
    assert not figures_not_on_their_rows(readme, results_page.BENCHMARKS_MD.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", MARKDOWN_PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_link_into_the_benchmarks_page_reaches_its_row_or_section(page):
    wrong = figures_not_on_their_rows(
        page.read_text(encoding="utf-8"), results_page.BENCHMARKS_MD.read_text(encoding="utf-8")
    )
    assert not wrong, f"{page.name}: links to no row of the benchmarks page, or not to the row's figure: {wrong}"


def test_every_headline_figure_links_to_its_measurement():
    # The headline table's figures are measurements: each row cites the benchmark row or model card.
    readme = README.read_text(encoding="utf-8")
    table = readme.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    assert rows
    for row in rows:
        assert "](BENCHMARKS.md#" in row or "](docs/models/" in row, row


def test_the_figure_check_finds_a_wrong_figure_and_a_missing_anchor():
    benchmarks = '| <a id="b-auto-512"></a>auto | 512 | 1.22 |\n| <a id="b-goal"></a>goal | 11 | 0.14–0.77 |\n'
    readme = "[1.22x](BENCHMARKS.md#b-auto-512), [0.14x-0.77x](BENCHMARKS.md#b-goal), [11 models](BENCHMARKS.md#b-goal)"
    assert figures_not_on_their_rows(readme, benchmarks) == []
    readme = "[1.23x](BENCHMARKS.md#b-auto-512) and [2x](BENCHMARKS.md#b-auto-1024)"
    assert figures_not_on_their_rows(readme, benchmarks) == [
        ("1.23x", "b-auto-512", ['<a id="b-auto-512"></a>auto', "512", "1.22"]),
        ("2x", "b-auto-1024", None),
    ]
    benchmarks = "## `b`\n\n" + benchmarks
    guide = "[the run](../benchmarks.md#b), [its row](../benchmarks.md#b-auto-512), [1.22x](../benchmarks.md#b)"
    assert figures_not_on_their_rows(guide, benchmarks) == [("1.22x", "b", None)]
    guide = "[the run](../benchmarks.md#c) and [1.3x](benchmarks.md#b-auto-512)"
    assert figures_not_on_their_rows(guide, benchmarks) == [
        ("the run", "c", None),
        ("1.3x", "b-auto-512", ['<a id="b-auto-512"></a>auto', "512", "1.22"]),
    ]
