"""The version moves with the changes: `keras_attn/version.py` names the newest release of
CHANGELOG.md, the releases are in order, and what is not released yet sits in one "Unreleased"
section on top (the site shows the file itself: docs/changelog_page.py)."""

import re

import keras_attn
from docs import changelog_page
from docs import home_page


def test_the_version_is_the_newest_release_of_the_changelog():
    newest_version, _ = changelog_page.releases()[0]
    assert home_page.version() == keras_attn.__version__ == newest_version


def test_the_releases_are_newest_first_with_unreleased_changes_on_top():
    text = changelog_page.CHANGELOG.read_text(encoding="utf-8")
    releases = changelog_page.releases(text)
    versions = [tuple(int(part) for part in version.split(".")) for version, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert [date for _, date in releases] == sorted((date for _, date in releases), reverse=True)
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings[0] == "[Unreleased]" and len(headings) == len(releases) + 1, headings


def test_the_release_headings_are_read_as_released_versions():
    text = "## [Unreleased]\n\n## [1.10.0] - 2027-01-02\n\n## [1.9.1] - 2026-12-31\n"
    assert changelog_page.releases(text) == [("1.10.0", "2027-01-02"), ("1.9.1", "2026-12-31")]
