# Course entry points. The first target that needs Python creates .venv and installs
# everything from pyproject.toml, so `make lab` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKSPACE ?= workspace
LAB_ARGS ?=
PYTEST_ARGS ?=

.PHONY: help venv lab test release course

help:
	@echo "make lab      open JupyterLab on your own copy of the labs in $(WORKSPACE)/"
	@echo "make test     run the whole test suite (every notebook in quick mode)"
	@echo "make release  write the learner edition to build/release/"
	@echo "make course   execute every lab (full mode) into build/course/ as .ipynb and .html"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; run: make PYTHON=/path/to/python3.10+ ...")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e .
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m utils.release --workspace $(WORKSPACE)
	$(BIN)/jupyter lab --notebook-dir=$(WORKSPACE) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

release: $(STAMP)
	$(BIN)/python -m utils.release --out build/release

course: $(STAMP)
	$(BIN)/python -m utils.course --out build/course labs/*.ipynb
