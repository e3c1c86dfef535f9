"""Headless Chromium for page tests: Debian's `chromium` driven by playwright's Python package.

Set-up (the Makefile's `browser` target does it): `apt-get install -y chromium` and `pip install -e '.[test]'` (playwright).
Playwright's own browser download is not used. Without a browser the tests skip, saying what to
install; with CI=true they fail instead.
"""

import contextlib
import os
import shutil

import pytest

INSTALL = "install Debian's chromium (`apt-get install -y chromium`) and playwright (`pip install -e '.[test]'`)"


def chromium_path():
    return os.environ.get("KERAS_ATTN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _missing(reason):
    message = f"browser tests need a browser: {reason}; {INSTALL}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@contextlib.contextmanager
def open_page(path):
    """A playwright page showing the file `path`; fails the test on any console error or page error."""
    with open_url(path.resolve().as_uri()) as page:
        yield page


@contextlib.contextmanager
def open_url(url, width=1400):
    """A playwright page `width` pixels wide showing `url`; fails the test on any console error or
    page error, on this page or any other the test then opens in it."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    executable = chromium_path()
    if executable is None:
        _missing("no `chromium` on PATH (or $KERAS_ATTN_CHROMIUM)")
    errors = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on(
                "requestfailed",
                lambda request: (
                    _network_error(request) and errors.append(f"request failed: {request.url} ({request.failure})")
                ),
            )
            page.goto(url)
            yield page
        finally:
            browser.close()
    assert not errors, f"the page logged errors: {errors}"


def _network_error(request):
    """Whether a failed request is the page's fault. A request the browser itself cancelled because
    the test moved to the next page (`net::ERR_ABORTED`, e.g. Chromium's late favicon fetch) is not;
    a missing file is not a failed request either: it answers 404 and the console logs it."""
    return request.failure != "net::ERR_ABORTED"


def broken_images(page):
    """Sources of the `<img>` elements of `page` that did not decode."""
    return page.evaluate(
        "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 60))"
    )
