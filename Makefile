# The two commands (see README.md):
#   make main   install, then train/evaluate/export/verify the IMDB classifier on ../shared/data
#   make test   install (and Debian's chromium for the page tests), then run the test suite (CI): every test
#               but the `slow` ones, each app's end-to-end run included
#   make test-slow   the `slow` tests: multi-worker runs, every family's training and export, the
#               benchmarks' smoke runs (over half an hour more; before a release, not CI)
#   make test-quick   the library's contract over every attention family, in a minute or two (the inner loop)
#   make test-compat   the library's own tests on the oldest supported TensorFlow/Keras and KerasHub
#   make fuzz   the adversarial suite (tests/test_adversarial.py) drawing random calls for FUZZ_MINUTES (default 10),
#               then the counts per surface (right / clear error / silent wrong / unclear) in FUZZ_RESULTS
#   make test-matrix   the same tests on every supported TensorFlow minor with its Keras range's ends (not CI)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export NO_MKDOCS_2_WARNING ?= 1

.PHONY: install browser lint main test test-slow test-quick test-compat test-matrix docs bench fuzz

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[apps,test,docs]"
	touch $@

install: $(VENV)/.installed

# The page tests drive Debian's chromium (playwright's own browser download needs the network).
# On a fresh machine as root it is installed from the package registry; otherwise say what to do.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	echo "make: chromium is not installed (apt-get install -y chromium): the browser tests skip, and fail under CI=true"

main: install
	$(PY) -m pipelines.main_job $(ARGS)

# Whole modules per worker (a module's fixtures are built once), handed out in collection order,
# which tests/conftest.py makes the slow modules' first (xdist would otherwise order them by test count).
test: install browser lint
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not slow" --durations=25 $(ARGS)

test-slow: install browser
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m slow --durations=25 $(ARGS)

# The inner loop, a kernel's change checked in a minute or two: every attention family against the
# float64 reference in its block, through a Keras file, in a graph and under XLA, and every public
# argument's validation; QUICK= adds the kernel's own tests (`make test-quick QUICK=tests/test_lsh_attention.py`).
QUICK_CONTRACT := tests/test_attention_families.py tests/test_argument_validation.py
test-quick: install
	$(PY) -m pytest -n 2 --dist worksteal -q -p no:cacheprovider --library-only -m "not slow" -x --durations=10 $(QUICK_CONTRACT) $(QUICK) $(ARGS)

# The library's own tests (`--library-only`: tests/library_selection.py), the slow ones left to
# `make test`, in a separate venv holding the oldest supported pair (oldest-supported.txt, the
# floors of setup.cfg's install_requires), the library's `viz` extra and no app dependency but the
# oldest KerasHub (oldest-supported.txt): with it, the tests of `keras_attn.convert` join
# (`--importable`: they build KerasHub's models and the keras.io examples of models/, plain Keras).
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_INSTALL := -e ".[viz]" "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "build>=1" "setuptools>=68" wheel
COMPAT_TESTS := -q -p no:cacheprovider --library-only --importable keras_hub --importable models.keras_io_examples -m "not slow" tests keras_attn

$(COMPAT_VENV)/.installed: setup.cfg pyproject.toml oldest-supported.txt
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet --upgrade pip
	$(COMPAT_PY) -m pip install --quiet -c oldest-supported.txt -r oldest-supported.txt $(COMPAT_INSTALL)
	touch $@

test-compat: $(COMPAT_VENV)/.installed
	$(COMPAT_PY) -m pytest -n 2 --dist loadfile --durations=25 $(COMPAT_TESTS) $(ARGS)

# `make test-compat`'s tests on each supported TensorFlow minor with the lowest and the highest Keras
# pip installs beside it, and a KerasHub that installs with the pair (benchmarks/version_matrix.py's
# CELLS), one venv each under .venv-matrix/, one cell's tests at a time; the results in
# benchmarks/results/version_matrix.json and the table in docs/supported_versions.md (README.md links it).
# Not in CI (eight TensorFlow installs): run it when the supported range or a cell's pins change.
# `make test-matrix MATRIX_ARGS="--only 2.20.0-3.15.1"` runs one cell.
MATRIX_WORKERS ?= 2
test-matrix: install
	$(PY) -m benchmarks.version_matrix --install '$(COMPAT_INSTALL)' --pytest '-n $(MATRIX_WORKERS) --dist loadfile $(COMPAT_TESTS) $(ARGS)' $(MATRIX_ARGS)

# ruff: lint (pyflakes, pycodestyle, bugbear, import order) and the formatter, configured in pyproject.toml.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The reference site (MkDocs + mkdocstrings, from the docstrings) into site/, warnings as errors.
docs: install
	$(PY) -m mkdocs build --strict

# Every benchmark script in turn (benchmarks/run_all.py): its results and plot in
# benchmarks/results/make_bench/, then BENCHMARKS.md made from them (the site's page too, by
# `make docs`). `make bench ARGS=--render-only` makes the page again without measuring.
bench: install
	$(PY) -m benchmarks.run_all $(ARGS)

# The adversarial suite, random instead of CI's fixed examples: every property draws for its share of
# FUZZ_MINUTES, hypothesis printing each minimal failing example; the table of outcomes per surface is
# printed and written to FUZZ_RESULTS.
FUZZ_MINUTES ?= 10
FUZZ_RESULTS ?= benchmarks/results/fuzz.json
fuzz: install
	KERAS_ATTN_FUZZ_MINUTES=$(FUZZ_MINUTES) KERAS_ATTN_FUZZ_RESULTS=$(FUZZ_RESULTS) \
	$(PY) -m pytest -n 0 -q -s -p no:cacheprovider tests/test_adversarial.py $(ARGS)
