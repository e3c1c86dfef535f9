"""The oldest supported pair is written once: `oldest-supported.txt` (what `make test-compat`
installs) pins exactly the floors of setup.cfg's `install_requires`, and the apps' exact pins
(the `apps` extra) lie inside the library's range. Its one other pin is the oldest KerasHub the
conversion tests run on, a test dependency no newer than the `test` extra's (`make test`'s)."""

import configparser
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(.*)$")


def _requirements(text):
    """`{name: specifier}` of the requirement lines of `text` (comments and `%(extra)s` lines skipped)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("%"):
            name, specifier = REQUIREMENT.match(line).groups()
            found[name.lower()] = specifier.replace(" ", "")
    return found


def _setup_cfg():
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO_ROOT / "setup.cfg")
    return config


def _floor(specifier):
    return re.search(r">=([0-9.]+)", specifier).group(1)


def _version(release):
    return tuple(int(part) for part in release.split("."))


def test_the_compat_pins_are_the_floors_of_install_requires():
    install_requires = _requirements(_setup_cfg()["options"]["install_requires"])
    oldest = _requirements((REPO_ROOT / "oldest-supported.txt").read_text())
    assert set(install_requires) <= set(oldest)
    for name, specifier in install_requires.items():
        assert _version(oldest[name].removeprefix("==")) == _version(_floor(specifier)) + (0,) * (
            len(oldest[name].removeprefix("==").split(".")) - len(_floor(specifier).split("."))
        ), f"{name}: oldest-supported.txt {oldest[name]}, install_requires {specifier}"


def test_the_apps_pins_lie_inside_the_library_range():
    config = _setup_cfg()
    install_requires = _requirements(config["options"]["install_requires"])
    apps = _requirements(config["options.extras_require"]["apps"])
    for name in ("tensorflow", "keras"):
        library_floor, apps_floor = _floor(install_requires[name]), _floor(apps[name])
        assert _version(library_floor) <= _version(apps_floor), (name, install_requires[name], apps[name])
        assert re.search(r"<([0-9.]+)", apps[name]).group(1) == re.search(r"<([0-9.]+)", install_requires[name]).group(
            1
        )


def test_the_other_compat_pins_are_test_dependencies_no_newer_than_make_tests():
    config = _setup_cfg()
    install_requires = _requirements(config["options"]["install_requires"])
    test = _requirements(config["options.extras_require"]["test"])
    oldest = _requirements((REPO_ROOT / "oldest-supported.txt").read_text())
    others = set(oldest) - set(install_requires)
    assert others == {"keras-hub"}, others
    for name in others:
        pinned = oldest[name].removeprefix("==")
        assert _version(pinned) <= _version(_floor(test[name])), (name, oldest[name], test[name])
