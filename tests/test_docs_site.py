"""The reference site, built as `make docs` builds it and opened in a real browser 1,280 px wide:
every page loads without console errors, every internal link and anchor resolves, no table is
clipped, every public name has a page in the navigation with its signature first, its arguments
and an example, a search for "multi head" finds `MultiHeadAttention` and the kernels guide's
formulas render. The pages' Python examples run as written, each as its own test."""

import contextlib
import functools
import html
import http.server
import importlib
import inspect
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

import keras_attn
from docs import api_pages
from docs import benchmarks_page
from docs import call_arguments
from docs import crosslinks
from docs import doctest_blocks
from tests.browser import broken_images
from tests.browser import open_url
from tests.markdown_examples import is_setup
from tests.markdown_examples import python_examples
from tests.markdown_examples import run_example
from tests.markdown_examples import self_comparisons

REPO_ROOT = Path(__file__).resolve().parents[1]
PUBLIC = [name for name in keras_attn.__all__ if not name.startswith("__")]
MODULES = {
    "attention_families",
    "ops",
    "packing",
    "patterns",
}  # public modules: a page of members, no signature of their own


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass  # one line per request would bury the test's output


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The directory of the site built with warnings as errors."""
    out = tmp_path_factory.mktemp("site")
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def site(built_site):
    """The built site served on a loopback port."""
    out = built_site
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


WIDTH = 1280  # a laptop screen
# A table is clipped when it, or a box around it up to the page's text that clips or scrolls its
# content (overflow other than `visible`: Material's scrolling wrapper), is wider than it shows.
CLIPPED_TABLES = """() => Array.from(document.querySelectorAll('article table')).flatMap(table => {
    for (let box = table; box; box = box.tagName === 'ARTICLE' ? null : box.parentElement)
        if (getComputedStyle(box).overflowX !== 'visible' && box.scrollWidth > box.clientWidth)
            return [`${box.scrollWidth} > ${box.clientWidth} px: ${table.innerText.slice(0, 60)}`];
    return [];
})"""


def crawl(site):
    """Every page reachable from the home page (navigation, contents and text links), each opened
    at `WIDTH` px: `{url: (article text, doctest examples, signature or None, clipped tables)}`.
    Fails on a console error, a page or file that does not load, or an anchor that is missing."""
    seen, queue, pages, anchors_to_check, ids = set(), [site], {}, {}, {}
    with open_url(site, width=WIDTH) as page:
        while queue:
            url = queue.pop()
            if url in seen:
                continue
            seen.add(url)
            if not url.endswith(("/", ".html")):  # a file the text links to
                assert page.request.get(url).status == 200, f"dead link: {url}"
                continue
            response = page.goto(url, wait_until="networkidle")  # the search worker loads before we leave
            assert response is not None and response.status == 200, f"dead link: {url}"
            assert not broken_images(page), f"{url}: images that do not load: {broken_images(page)}"
            examples = page.eval_on_selector_all(
                "article pre",
                "blocks => blocks.filter(b => b.closest('.language-python') && !b.closest('.mkdocstrings-source')).length",
            )
            signature = page.query_selector("article h1 + .doc-signature")
            signature = signature.inner_text() if signature else None
            pages[url] = (page.inner_text("article"), examples, signature, page.evaluate(CLIPPED_TABLES))
            ids[url] = set(page.eval_on_selector_all("[id]", "elements => elements.map(e => e.id)"))
            for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
                target, _, anchor = href.partition("#")
                if not target.startswith(site):
                    continue  # external links are not followed (and there should be none)
                if anchor:
                    anchors_to_check.setdefault(target, set()).add(anchor)
                queue.append(target)
    for target, anchors in anchors_to_check.items():  # each page's ids, read when it was open
        missing = anchors - ids.get(target, set())
        assert not missing, f"{target}: no anchor {sorted(missing)}"
    return pages


def test_every_page_loads_every_link_resolves_no_table_is_clipped_and_every_public_name_has_its_page(site):
    """Over a minute: a real browser opens every page of the built site (about 60) and every link on it."""
    pages = crawl(site)
    clipped = {url: tables for url, (_, _, _, tables) in pages.items() if tables}
    assert not clipped, f"tables clipped at {WIDTH} px: {clipped}"
    for name in api_pages.public_names():
        url = urllib.parse.urljoin(site, api_pages.page_path(name).removesuffix(".md") + "/")
        assert url in pages, f"keras_attn.{name} has no page reachable from the home page"
        text, examples, signature, _ = pages[url]
        short_name = name.split(".")[-1]
        if name in MODULES:
            assert signature is None, f"keras_attn.{name}: a module page with a signature"
            continue
        assert signature and signature.startswith(f"{short_name}("), f"keras_attn.{name}: no signature first"
        if name in PUBLIC:  # the top-level names (keras_attn.visualization's: a signature is enough)
            if inspect.signature(getattr(keras_attn, name)).parameters:  # `enable()` has none
                assert "PARAMETER" in text, f"keras_attn.{name}: no arguments"
            assert examples, f"keras_attn.{name}: no runnable example"


def test_searching_multi_head_finds_multi_head_attention(site):
    with open_url(site, width=WIDTH) as page:
        page.wait_for_load_state("networkidle")  # the search index is loaded
        page.click("input.md-search__input")
        page.keyboard.type("multi head")
        page.wait_for_selector(".md-search-result__item")
        found = page.eval_on_selector_all(".md-search-result__item > a", "links => links.map(a => a.href)")
    pages = [urllib.parse.urlsplit(href)._replace(query="", fragment="").geturl() for href in found]
    assert urllib.parse.urljoin(site, "api/MultiHeadAttention/") in pages, found


def test_the_kernels_guide_renders_its_math(site):
    with open_url(urllib.parse.urljoin(site, "guides/kernels/"), width=WIDTH) as page:
        formulas = page.query_selector_all("article .arithmatex")
        assert len(formulas) >= 5
        assert all(formula.query_selector(".katex") for formula in formulas), "a formula KaTeX did not render"


def test_every_public_name_has_one_navigation_section_and_a_new_one_stops_the_build():
    assert api_pages.checked_sections(api_pages.SECTIONS, api_pages.public_names())
    with pytest.raises(ValueError, match=r"not placed \['NewLayer'\]"):
        api_pages.checked_sections(api_pages.SECTIONS, [*api_pages.public_names(), "NewLayer"])
    with pytest.raises(ValueError, match=r"placed twice \['convert'\]"):
        api_pages.checked_sections({**api_pages.SECTIONS, "Again": ["convert"]}, api_pages.public_names())


def test_a_code_span_naming_a_public_name_links_to_its_page_outside_code_blocks():
    text = "`ALiBi`, `keras_attn.convert`, `alibi`, `convert`, [`ALiBi`](a.md)\n\n```python\nx = `ALiBi`\n```\n"
    assert crosslinks.linked(text, crosslinks.identifiers()) == (
        "[`ALiBi`][keras_attn.ALiBi], [`keras_attn.convert`][keras_attn.convert], `alibi`, `convert`, "
        "[`ALiBi`](a.md)\n\n```python\nx = `ALiBi`\n```\n"
    )


def test_a_layers_call_arguments_section_becomes_its_call_methods_arguments_and_returns():
    class_docstring = (
        "A layer.\n\nArgs:\n    units: width.\n\n"
        "Call arguments (the convention of\n    every layer):\n    inputs: `(batch, features)`.\n"
        "    mask: optional; a long\n        description.\n\nReturns:\n    `(batch, units)`; then\n    more.\n\n"
        "Example:\n\n>>> 1\n1"
    )
    remaining, call = call_arguments.call_docstring(class_docstring)
    assert remaining == "A layer.\n\nArgs:\n    units: width.\n\n" + call_arguments.POINTER + "\nExample:\n\n>>> 1\n1"
    assert call == (
        "The convention of every layer.\n\nArgs:\n    inputs: `(batch, features)`.\n"
        "    mask: optional; a long\n        description.\n\nReturns:\n    `(batch, units)`; then\n    more."
    )
    assert call_arguments.call_docstring("A layer.\n\nCall arguments: those of `SelfAttention`.") == (
        "A layer.\n\nCall arguments: those of `SelfAttention`.",
        None,
    )


def test_the_families_table_puts_each_measurement_in_its_row_and_column_and_says_why_a_step_did_not_run():
    result = json.loads(benchmarks_page.FAMILIES_RESULT.read_text())
    lines = benchmarks_page.families_table(result).splitlines()
    lengths = [int(cell.split()[0].replace(",", "")) for cell in lines[0].strip("|").split("|")[1:]]
    rows = {
        line.split("|")[1].strip(" `"): line.strip("|").split("|")[1:] for line in lines[2:] if line.startswith("| `")
    }
    measured = [row for row in result["rows"] if row["mode"] == "forward_backward"]
    assert len(measured) == len(rows) * len(lengths)
    for row in measured:
        cell = rows[row["case"]][lengths.index(row["length"])].strip()
        if row["status"] == "ok":
            assert cell == f"{row['call_gb']:.2f} GB, {row['seconds']:.1f} s"
        else:
            assert cell == "not run" and f"- `{row['case']}` at {row['length']:,} tokens {row['status']}" in lines


PAGE_EXAMPLES = [
    pytest.param(code, page, is_setup(name), id=f"{page.relative_to(REPO_ROOT / 'docs')}::{name}")
    for page in sorted((REPO_ROOT / "docs").rglob("*.md"))
    for name, code in python_examples(page)
]


def test_the_pages_have_python_examples():
    assert len(PAGE_EXAMPLES) >= 4


@pytest.fixture(scope="session")
def prepared_directories(tmp_path_factory):
    """`prepared(page)`: a working directory in which `page`'s setup blocks have run, made once
    per page (the files they write are what the page's other blocks read, as for a reader)."""
    directories = {}

    def prepared(page):
        if page not in directories:
            directory = tmp_path_factory.mktemp(page.stem)
            with contextlib.chdir(directory):
                for name, code in python_examples(page):
                    if is_setup(name):
                        run_example(code, page)
            directories[page] = directory
        return directories[page]

    return prepared


@pytest.mark.parametrize("code,page,setup", PAGE_EXAMPLES)
def test_the_pages_python_examples_run(code, page, setup, prepared_directories, tmp_path, monkeypatch):
    if setup:
        monkeypatch.chdir(tmp_path)  # a setup block runs as a reader runs it: in a directory of its own
    elif any(is_setup(name) for name, _ in python_examples(page)):
        monkeypatch.chdir(prepared_directories(page))
    run_example(code, page)


def _text(fragment):
    """The text of an HTML fragment, as a reader copying it gets it."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def api_page(built_site, name):
    return (built_site / api_pages.page_path(name).removesuffix(".md") / "index.html").read_text(encoding="utf-8")


def documented_arguments(obj):
    """The argument names of `obj`'s docstring's `Args:` section (its first-level entries)."""
    section = re.search(r"(?m)^    Args:\n((?:        .*\n|[ \t]*\n)+)", obj.__doc__ or "")
    return re.findall(r"(?m)^        \*{0,2}(\w+)(?: \([^)]*\))?:", section.group(1)) if section else []


def public_object(name):
    module, _, short = name.rpartition(".")
    return getattr(importlib.import_module(f"keras_attn.{module}" if module else "keras_attn"), short)


def test_every_class_page_signature_lists_every_documented_argument_and_its_default(built_site):
    for name in api_pages.public_names():
        obj = public_object(name)
        if not inspect.isclass(obj):
            continue
        signature = re.search(r'class="[^"]*doc-signature[^"]*">(.*?)</code>', api_page(built_site, name), re.DOTALL)
        shown = _text(signature.group(1))
        missing = [argument for argument in documented_arguments(obj) if not re.search(rf"\b{argument}\b", shown)]
        assert not missing, f"keras_attn.{name}: the page's signature {shown!r} hides {missing}"
        for parameter in inspect.signature(obj).parameters.values():
            if parameter.default is not inspect.Parameter.empty and parameter.default is not None:
                assert f"{parameter.name}=" in shown, f"keras_attn.{name}: no default shown for {parameter.name}"


def article_without_source(page_html):
    """A built page's article, without the collapsed "Source code in ..." blocks."""
    article = page_html.split("<article", 1)[1]
    return re.sub(r'<details class="mkdocstrings-source">.*?</details>', "", article, flags=re.DOTALL)


def rendered_examples(page_html):
    """The Python code blocks of a built page, as a reader copies them."""
    blocks = re.findall(
        r'<div class="language-python highlight"><pre>(.*?)</pre>', article_without_source(page_html), re.DOTALL
    )
    return [_text(block) for block in blocks]


@pytest.mark.parametrize("name", api_pages.public_names())
def test_every_api_page_example_runs_as_copied_and_links_its_guides(built_site, name):
    page = api_page(built_site, name)
    assert "&gt;&gt;&gt;" not in article_without_source(page), f"{name}: a >>> prompt"
    namespace = {"__name__": "api_example"}
    for code in rendered_examples(page):  # in order, in one namespace: a later example may follow on
        assert not self_comparisons(code), f"{name}: an example compares a thing with itself:\n{code}"
        exec(compile(code, f"api/{name}", "exec"), namespace)
    guides = re.search(r'id="guides".*?</ul>', page, re.DOTALL)
    assert guides and re.search(r'href="(?:\.\./)+(?:guides|models)/', guides.group(0)), f"{name}: no guide linked"


def test_the_home_page_shows_the_version_and_links_every_guide(built_site):
    home = (built_site / "index.html").read_text(encoding="utf-8")
    assert f"Version {keras_attn.__version__}." in _text(home)
    for guide in sorted((REPO_ROOT / "docs" / "guides").glob("*.md")):
        assert f'href="guides/{guide.stem}/"' in home, f"the home page does not link {guide.name}"


def test_a_doctest_becomes_python_that_imports_what_it_uses_by_its_public_path():
    import griffe

    package = griffe.load("keras_attn", search_paths=[str(REPO_ROOT)])
    module = package["layers.conversion"]
    docstring = "Text.\n\n>>> x = keras.Input((2,))\n>>> convert(x)  # doctest: +SKIP\n'out'\n\n>>> x.shape\n(None, 2)"
    assert doctest_blocks.runnable_examples(docstring, module, doctest_blocks.public_paths(package)) == (
        "Text.\n\n```python\nimport keras\nfrom keras_attn import convert\n\nx = keras.Input((2,))\nconvert(x)\n"
        "# 'out'\n```\n\n```python\nx.shape\n# (None, 2)\n```"
    )
