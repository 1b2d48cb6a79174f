# Two entry points (see README): `make bench` and `make test`. Both create .venv on first
# use and are safe to run again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup bench test models clean-results

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

models: setup
	$(BIN)/reusebench models

test: setup
	$(BIN)/python -m pytest -q

clean-results:
	rm -rf results/asv results/html results/runs
