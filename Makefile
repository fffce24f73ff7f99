# Trove: `make run` crawls the local sandbox web, `make test` runs the whole suite.
# Needs only Python 3.11+ and make: everything else is installed into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SEEDS  ?=
PYTEST_ARGS ?=
# The suite waits on brokers, databases and politeness gaps far more than it computes:
# two workers, each with its own nats-server and Postgres, halve its time on two cores.
# Against external servers (TROVE_NATS_URL, TROVE_DATABASE_URL) the workers would share
# them, and each test's reset would pull the other's state away: one process then.
TEST_WORKERS ?= $(if $(TROVE_NATS_URL)$(TROVE_DATABASE_URL),0,2)
FUZZ_ARGS ?=

.PHONY: install run test lint typecheck bench fuzz faults asyncapi smoke clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
ifeq ($(strip $(SEEDS)),)
	$(BIN)/trove crawl --sandbox --fediverse 40 --fresh --until-idle
else
	$(BIN)/trove crawl --until-idle $(SEEDS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/bench_fetcher.py
	$(BIN)/python bench/bench_recorder.py
	$(BIN)/python bench/bench_seen.py

# compose.yaml on a real container engine (minutes, so not in `make test`): build, up,
# crawl, a crash, down and up (tests/deploy/smoke_compose.py). With no engine running,
# it starts one with SMOKE_ENGINE_UP.
SMOKE_ENGINE_UP ?= $(if $(wildcard ../shared/tools/container-engine),../shared/tools/container-engine up)

smoke: $(STAMP)
	SMOKE_ENGINE_UP="$(SMOKE_ENGINE_UP)" $(BIN)/python tests/deploy/smoke_compose.py

# Thousands of hostile seeds and pages through the real services (tests/fuzz runs a few
# hundred in `make test`); FUZZ_ARGS e.g. --rounds 8 --seed 7.
fuzz: $(STAMP)
	$(BIN)/python bench/bench_fuzz.py $(FUZZ_ARGS)

# A crawl while services, nats-server and Postgres are killed, then on a three-node
# JetStream cluster losing a node, each held to a fault-free crawl of the same web.
faults: $(STAMP)
	$(BIN)/python bench/bench_faults.py

asyncapi: $(STAMP)
	$(BIN)/faststream docs gen trove_schema.asyncapi:app --yaml --out docs/asyncapi.yaml

clean:
	rm -rf $(VENV) .trove .mypy_cache .ruff_cache .pytest_cache
