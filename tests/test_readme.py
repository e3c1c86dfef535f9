"""The README is the front door: every Python example in it runs as written, each as its own test
named after its section, and it stays short and free of lab notes (those live in the model cards
and on the benchmarks page)."""

import pathlib
import re

import pytest

from tests.markdown_examples import python_examples
from tests.markdown_examples import run_example

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
FRONT_PAGES = [README, *sorted((REPO_ROOT / "docs" / "guides").glob("*.md"))]
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
