# Trove: `make run` crawls the local sandbox web (state in .trove-sandbox, emptied at each
# run), `make test` runs the whole suite.
# Needs only Python 3.11+ and make: everything else is installed into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The pip the lock is installed with, not whichever is newest on the day.
PIP_VERSION ?= 26.3
SEEDS  ?=
PYTEST_ARGS ?=
# The suite waits on brokers, databases and politeness gaps far more than it computes:
# workers each with their own nats-server and Postgres. Four keep two cores busy (a fifth
# of them still idle); three ran the suite a fifth slower, five left it short of cores.
# Against external servers (TROVE_NATS_URL, TROVE_DATABASE_URL) the workers would share
# them, and each test's reset would pull the other's state away: one process then.
TEST_WORKERS ?= $(if $(TROVE_NATS_URL)$(TROVE_DATABASE_URL),0,4)
FUZZ_ARGS ?=

# Debian and Ubuntu ship ensurepip, which venv needs, in a package apart from Python's.
VENV_HELP = $(PYTHON) could not create $(VENV). On Debian or Ubuntu, install its venv \
package (sudo apt install python$(shell $(PYTHON) -c 'import sys; print(*sys.version_info[:2], sep=".")')-venv), then run make again.

# Each word in single quotes for sh, a quote within as '\'': a seed's & ; ? $ and ' stay
# the URL's, not the shell's (and its $ not make's: $(value SEEDS)).
sh_words = $(foreach word,$(1),'$(subst ','\'',$(word))')

.PHONY: install run test lint typecheck bench fuzz faults asyncapi smoke clean

$(STAMP): pyproject.toml constraints.txt
	@echo "$(PYTHON) -m venv $(VENV)"
	@$(PYTHON) -m venv $(VENV) || { echo "$(VENV_HELP)" >&2; exit 1; }
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
ifeq ($(strip $(SEEDS)),)
	TROVE_STATE_DIR=.trove-sandbox $(BIN)/trove crawl --sandbox --fediverse 40 --fresh --until-idle
else
	$(BIN)/trove crawl --until-idle $(call sh_words,$(value SEEDS))
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

# Not .trove: `trove up` keeps real crawls there, their event record included.
clean:
	rm -rf $(VENV) .trove-sandbox .mypy_cache .ruff_cache .pytest_cache
