"""MkDocs hook: the site's `changelog.md` is the repository's `CHANGELOG.md` as it stands, so the
site and the repository never hold two changelogs.

`releases()` reads the released versions from its `## [x.y.z] - date` headings, newest first
(`tests/test_docs_site.py` holds the newest to `keras_attn/version.py`)."""

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO_ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = REPO_ROOT / "CHANGELOG.md"
PAGE = "changelog.md"
_RELEASE = re.compile(r"^## \[(\d[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def releases(text=None):
    """`[(version, date), ...]` of the released sections of `text` (CHANGELOG.md's), newest first."""
    return _RELEASE.findall(CHANGELOG.read_text(encoding="utf-8") if text is None else text)


def on_files(files, config):
    files.append(File.generated(config, PAGE, content=CHANGELOG.read_text(encoding="utf-8")))
    return files
