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
SUBMISSIONS ?=
JOBS ?= 1
GRADE_ARGS ?=
RELEASE_ARGS ?=

.PHONY: help venv lab test test-fast release course grade slides

help:
	@echo "make lab      open JupyterLab on your own copy of the labs in $(WORKSPACE)/"
	@echo "make test     run the whole test suite (every notebook in quick mode)"
	@echo "make test-fast  the tests not marked slow (no real jobs or notebooks): a few minutes"
	@echo "make release  write the learner bundle (what learners get) to build/release/"
	@echo "make grade SUBMISSIONS=folder [JOBS=2]  grade assessment notebooks into build/grades/"
	@echo "make course   execute every lab and the assessment (full mode; COURSE_QUICK=1 for quick) into"
	@echo "              build/course/: executed notebooks, HTML pages and index.html, the course map"
	@echo "make slides   build every deck in slides/ into build/slides/ (reveal.js HTML and PDF, offline)"

venv: $(STAMP)

$(STAMP): pyproject.toml utils/etc/ipython_kernel_config.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; run: make PYTHON=/path/to/python3.10+ ...")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e .
	$(BIN)/python -m utils.px --install
	@# The course starts its clusters from code (utils.cluster): JupyterLab's IPython Parallel panel
	@# would offer a second kind its %%px cannot reach, and its server extension warns on every start.
	$(BIN)/jupyter server extension disable --sys-prefix ipyparallel
	$(BIN)/jupyter labextension disable --level=sys_prefix ipyparallel-labextension
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m tooling.release --workspace $(WORKSPACE)
	$(BIN)/jupyter lab --notebook-dir=$(WORKSPACE) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The library's, the checks' and the tools' unit tests, without the tests marked slow (real processes,
# jobs, notebooks): a few minutes, for a maintainer between edits. make test runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

release: $(STAMP)
	$(BIN)/python -m tooling.release --out build/release $(RELEASE_ARGS)

# Every lab, then the assessment where it exists; the index links to the decks that `slides` built.
# In the learner bundle (no slides/ folder) the course is built without the decks.
course: $(STAMP) $(if $(wildcard slides/build.py),slides)
	$(BIN)/python -m tooling.course --out build/course --index $(if $(wildcard slides/build.py),--slides build/slides) labs/*.ipynb $(wildcard assessment/assessment.ipynb)

# reveal.js comes from npm (slides/package-lock.json; `npm ci` runs when it is missing) and the
# PDFs from headless Chromium; the build says what to install when either is missing.
slides: $(STAMP)
	$(BIN)/python -m slides.build --out build/slides

grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=folder-of-notebooks [JOBS=2]"; exit 2; }
	@test -d assessment/grader || { echo "The grader is the instructor's: it is not in the learner bundle. Run your notebook's check cells for feedback."; exit 2; }
	$(BIN)/python -m assessment.grader.grade "$(SUBMISSIONS)" --jobs $(JOBS) --out build/grades $(GRADE_ARGS)
