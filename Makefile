# The two commands (see README.md):
#   make main   install, then train/evaluate/export/verify the IMDB classifier on ../shared/data
#   make test   install, then run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install main test

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

main: install
	$(PY) -m pipelines.main_job $(ARGS)

test: install
	$(PY) -m pytest -n 2 --dist loadfile -q $(ARGS)
