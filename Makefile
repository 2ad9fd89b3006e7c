# Every target sets up .venv by itself; a fresh machine needs only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run tour test lint bench screenshots format clean fuzz fuzz-api fuzz-stores fuzz-gateway fuzz-teams chaos

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,bench,daemon,postgres,gateway,otel,pydantic-ai,openai-agents,langchain]'
	touch $(STAMP)

# The daemon on http://127.0.0.1:4600 (SQLite under .corral/) with the example team.
run: $(STAMP)
	$(BIN)/python examples/team/run.py

# The library tour: budgets, deadlines and guardrails around an agent loop, then exits.
tour: $(STAMP)
	$(BIN)/python examples/tour.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two workers, a test file each (pytest-xdist): the suite mostly waits on real daemons,
# databases and a browser, so two halve its time on this 2-core machine.
# From bytecode, whatever the environment says (PYTHONDONTWRITEBYTECODE): the suite starts many
# Python processes (daemons, agents' workers), and each would compile corral again (8:10
# instead of 7:27 on this machine).
test: lint
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n 2 --dist loadfile

# The property-based suites with many more examples than `make test` runs: the HTTP API
# fuzzed from its OpenAPI document (schemathesis), the stores, the gateway's verdicts on
# empty reads and the daemon's teams as a state machine (hypothesis); minutes, not seconds.
fuzz: fuzz-api fuzz-stores fuzz-gateway fuzz-teams

fuzz-api: $(STAMP)
	CORRAL_FUZZ_EXAMPLES=200 $(BIN)/pytest -q -p no:randomly tests/daemon/test_api_fuzz.py

fuzz-stores: $(STAMP)
	CORRAL_FUZZ_EXAMPLES=300 $(BIN)/pytest -q -p no:randomly --timeout 900 tests/daemon/test_store_properties.py \
		tests/daemon/test_store_group.py -k "round_trips or spawns or groups_make"

fuzz-teams: $(STAMP)
	CORRAL_FUZZ_EXAMPLES=1000 CORRAL_FUZZ_STEPS=50 $(BIN)/pytest -q -p no:randomly tests/daemon/test_teams_stateful.py

fuzz-gateway: $(STAMP)
	HYPOTHESIS_PROFILE=long $(BIN)/pytest -q -p no:randomly --timeout=0 tests/gateway/test_emptiness.py

# Three daemons on one PostgreSQL database (CORRAL_TEST_PG), a random one killed every few
# seconds under load for CORRAL_CHAOS_S seconds, then the cluster's invariants checked
# (tests/daemon/cluster/test_chaos.py; CORRAL_CHAOS_SEED replays a run). `make test` skips it.
CORRAL_CHAOS_S ?= 60
chaos: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE CORRAL_CHAOS_S=$(CORRAL_CHAOS_S) $(BIN)/pytest -q -rP \
		-p no:randomly --timeout 600 tests/daemon/cluster/test_chaos.py

bench: $(STAMP)
	$(BIN)/python -m bench

# The console's pages as docs/console/*.png (docs/console.md shows them), taken by its browser
# tests in the system's Chromium (`apt-get install chromium`); `make test` keeps its own in /tmp.
screenshots: $(STAMP)
	CORRAL_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -q -p no:randomly tests/console/test_console_browser.py

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Pins every installed version, so an install from constraints.txt is reproducible.
constraints: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
