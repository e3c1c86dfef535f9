import pytest

from tests.shared_data import missing_shared_data


def test_missing_data_fails_loudly_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no archive"):
        missing_shared_data("no archive")


@pytest.mark.parametrize("ci", [None, "false"])
def test_missing_data_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no archive"):
        missing_shared_data("no archive")
