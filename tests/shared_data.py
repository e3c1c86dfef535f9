"""What a test does when the project's shipped data (`../shared/data`) is missing.

On a developer's machine the test is skipped, saying where the data was looked for. In CI
(`CI=true`) the data must be there: the test fails loudly instead, so a broken checkout can never
pass by skipping every real-data test.
"""

import os

import pytest


def in_ci():
    return os.environ.get("CI", "").lower() == "true"


def missing_shared_data(message):
    """Skips the calling test, or fails it under `CI=true`."""
    if in_ci():
        pytest.fail(f"CI=true and {message}: the shipped data must be present in CI", pytrace=False)
    pytest.skip(message)
