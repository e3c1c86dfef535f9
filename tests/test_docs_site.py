"""The reference site, built as `make docs` builds it and opened in a real browser: every page
loads without console errors, every internal link and anchor resolves, and every public name of
`keras_attn` has a page, reachable from the index, with its signature, arguments and an example.
The guides' Python examples run as written."""

import functools
import http.server
import inspect
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

import keras_attn
from tests.browser import open_url

REPO_ROOT = Path(__file__).resolve().parents[1]
PUBLIC = [name for name in keras_attn.__all__ if not name.startswith("__")]
MODULES = {"attention_families", "ops", "patterns"}  # public modules: a page of members, no signature of their own

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with warnings as errors, served on a loopback port."""
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
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_every_page_loads_every_link_resolves_and_every_public_name_has_its_page(site):
    seen, queue, pages, anchors_to_check = set(), [site], {}, {}
    with open_url(site) as page:
        while queue:
            url = queue.pop()
            if url in seen:
                continue
            seen.add(url)
            response = page.goto(url, wait_until="networkidle")  # the search worker loads before we leave
            assert response is not None and response.status == 200, url
            examples = page.eval_on_selector_all(
                "article pre", "blocks => blocks.filter(b => b.innerText.includes('>>>')).length"
            )
            pages[url] = (page.inner_text("article"), examples)
            for href in page.eval_on_selector_all("article a[href]", "links => links.map(a => a.href)"):
                target, _, anchor = href.partition("#")
                if not target.startswith(site):
                    continue  # external links are not followed (and there should be none)
                if anchor:
                    if target == url or not target:
                        assert page.query_selector(f"[id='{anchor}']"), f"{url}: no anchor #{anchor}"
                    else:
                        anchors_to_check.setdefault(target, set()).add(anchor)
                queue.append(target)
        for target, anchors in anchors_to_check.items():
            page.goto(target, wait_until="networkidle")
            for anchor in anchors:
                assert page.query_selector(f"[id='{anchor}']"), f"{target}: no anchor #{anchor}"
    for name in PUBLIC:
        url = urllib.parse.urljoin(site, f"api/{name}/")
        assert url in pages, f"keras_attn.{name} has no page reachable from the index"
        text, examples = pages[url]
        assert examples, f"keras_attn.{name}: no runnable (doctest) example"
        if name not in MODULES:
            assert re.search(rf"\b{name}\(", text), f"keras_attn.{name}: no signature"
            if inspect.signature(getattr(keras_attn, name)).parameters:  # `enable()` has none
                assert "Parameters:" in text, f"keras_attn.{name}: no arguments"


def test_the_guides_python_examples_run():
    blocks = [
        block
        for guide in sorted((REPO_ROOT / "docs").rglob("*.md"))
        for block in re.findall(r"```python\n(.*?)```", guide.read_text(), flags=re.DOTALL)
    ]
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, "docs", "exec"), {"__name__": "docs_example"})
