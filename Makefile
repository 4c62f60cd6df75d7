# Two commands do all set-up: `make demo` and `make test`. Both create .venv when it is missing;
# `make test` first installs the system tools the suite needs (.ci/system-tools), and CI runs it.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint docs install clean system-tools

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bradley --db demo/bradley.duckdb demo --workdir demo

# promtool (Debian's prometheus) and headless Chromium: installed when missing and possible,
# otherwise one line says what to install and the run stops
system-tools:
	.ci/system-tools

test: system-tools $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .

# the manual, offline: a warning, a broken link or a missing anchor fails (mkdocs.yml: strict)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf demo site .pytest_cache
