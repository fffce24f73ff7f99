# Trove: `make run` crawls the local sandbox web, `make test` runs the whole suite.
# Needs only Python 3.11+ and make: everything else is installed into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SEEDS  ?=
PYTEST_ARGS ?=

.PHONY: install run test lint typecheck bench asyncapi clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
ifeq ($(strip $(SEEDS)),)
	$(BIN)/trove crawl --sandbox --fresh --until-idle
else
	$(BIN)/trove crawl --until-idle $(SEEDS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/bench_fetcher.py
	$(BIN)/python bench/bench_recorder.py
	$(BIN)/python bench/bench_seen.py

asyncapi: $(STAMP)
	$(BIN)/faststream docs gen trove_schema.asyncapi:app --yaml --out docs/asyncapi.yaml

clean:
	rm -rf $(VENV) .trove .mypy_cache .ruff_cache .pytest_cache
