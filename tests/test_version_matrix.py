"""The supported versions are what `make test-matrix` runs (benchmarks/version_matrix.py's `CELLS`):
setup.cfg's `install_requires` ranges for TensorFlow and Keras are exactly the ranges the cells span
(every TensorFlow minor of the range, each with two Keras, the newest of the range one of them),
and the README's and the docs' sentences claim those ranges and the Python the cells ran on. Every
result recorded is of a cell's pins with no failed test, and the docs' table (docs/supported_versions.md)
is the results, naming the cells not run yet."""

import configparser
import re

from benchmarks import version_matrix

RESULTS = version_matrix.load_results()
RANGE_CLAIM = re.compile(r"TensorFlow (\d+\.\d+)-(\d+\.\d+),? (?:with )?Keras (\d+\.\d+)-(\d+\.\d+)")
PYTHON_CLAIM = re.compile(r"[Tt]ested on Python (\d+\.\d+)")


def _minor(version):
    return tuple(int(part) for part in version.split(".")[:2])


def _text(minor):
    return ".".join(map(str, minor))


def _install_requires():
    config = configparser.ConfigParser(interpolation=None)
    config.read(version_matrix.REPO_ROOT / "setup.cfg")
    found = {}
    for line in config["options"]["install_requires"].splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9.]+)\s*,\s*<\s*([0-9.]+)", line)
        if match:
            found[match.group(1)] = (_minor(match.group(2)), _minor(match.group(3)))
    return found


def _planned(package):
    index = ("tensorflow", "keras", "keras_hub").index(package)
    return sorted({_minor(cell[index]) for cell in version_matrix.CELLS})


def test_every_result_is_of_a_cell_on_its_pins_with_no_failed_test():
    cells = {version_matrix.cell_name(cell): cell for cell in version_matrix.CELLS}
    assert set(RESULTS) <= set(cells), sorted(set(RESULTS) - set(cells))
    for name, row in RESULTS.items():
        assert (row["tensorflow"], row["keras"], row["keras_hub"]) == cells[name]
        assert row["passed"] > 0 and row["failed"] == 0, (name, row["failed_tests"])


def test_the_docs_table_is_the_results():
    assert version_matrix.generated_section(version_matrix.TABLE_FILE.read_text()) == version_matrix.table(RESULTS)


def test_install_requires_spans_exactly_the_cells():
    ranges = _install_requires()
    for package in ("tensorflow", "keras"):
        ran = _planned(package)
        floor, cap = ranges[package]
        assert floor == ran[0], (package, floor, ran)
        assert cap == (ran[-1][0], ran[-1][1] + 1), (package, cap, ran)
    tensorflow_minors = _planned("tensorflow")
    assert tensorflow_minors == [(2, minor) for minor in range(tensorflow_minors[0][1], tensorflow_minors[-1][1] + 1)]
    newest_keras = _planned("keras")[-1]
    for minor in tensorflow_minors:
        kerases = {_minor(keras) for tensorflow, keras, _ in version_matrix.CELLS if _minor(tensorflow) == minor}
        assert newest_keras in kerases and len(kerases) == 2, (minor, kerases)


def test_the_readme_and_the_docs_claim_the_cells_ranges_and_the_python_they_ran_on():
    claimed_ranges = (
        _text(_planned("tensorflow")[0]),
        _text(_planned("tensorflow")[-1]),
        _text(_planned("keras")[0]),
        _text(_planned("keras")[-1]),
    )
    pythons = {_text(_minor(row["python"])) for row in RESULTS.values()}
    for path in (version_matrix.REPO_ROOT / "README.md", version_matrix.TABLE_FILE):
        text = path.read_text()
        assert RANGE_CLAIM.findall(text) and set(RANGE_CLAIM.findall(text)) == {claimed_ranges}, path
        claimed_pythons = set(PYTHON_CLAIM.findall(text))
        # Before any cell has run, the claim rests on `make test`'s and `make test-compat`'s venvs alone.
        assert claimed_pythons and (claimed_pythons == pythons or not RESULTS), (path, claimed_pythons, pythons)


def test_a_cells_counts_are_read_from_pytests_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_passes"/>'
        '<testcase classname="tests.test_a" name="test_fails"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.test_b" name="test_errors"><error message="fixture"/></testcase>'
        '<testcase classname="tests.test_b" name="test_skips"><skipped message="Keras 3.15 on"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert version_matrix.junit_counts(report) == (
        1,
        2,
        1,
        ["tests.test_a::test_fails", "tests.test_b::test_errors"],
    )
