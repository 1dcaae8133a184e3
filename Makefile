# nanofleet: `make` lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo "$(HOME)/.local/bin/uv")
UV_PIN := uv==0.13.9
PY := .venv/bin/python
COMPOSE := docker compose --env-file .env -f docker/compose.yml
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: help install run test lint typecheck check up down logs bench chaos chaos-smoke fuzz properties uv

help: ## Show this help
	@grep -hE '^[a-z-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

uv: # from PyPI with pip: for this user, also where the system Python is externally managed (PEP 668)
	@command -v uv >/dev/null 2>&1 || [ -x "$(UV)" ] \
	  || python3 -m pip install --quiet --user $(UV_PIN) 2>/dev/null \
	  || python3 -m pip install --quiet --user --break-system-packages $(UV_PIN) 2>/dev/null \
	  || python3 -m pip install --quiet $(UV_PIN) \
	  || { echo "make: could not install uv with pip; install it (pipx install $(UV_PIN)) and run make again" >&2; exit 1; }

install: uv ## Install nanofleet, its embedded servers (x86-64 Linux) and dev tools into .venv (uv, from the lock file)
	@$(UV) sync --frozen --extra embedded --quiet

run: install ## Run the whole system on this machine (embedded Redis/Postgres if none is configured)
	@.venv/bin/nanofleet up $(ARGS)

test: install ## Run the test suite, three processes (needs Postgres and Redis: see README)
	@$(PY) -m pytest -n 3

lint: install ## ruff
	@.venv/bin/ruff check .

typecheck: install ## mypy (strict)
	@.venv/bin/mypy shared gateway workers bench

check: lint typecheck test ## Everything CI runs

up: ## docker compose: start the stack in the background
	$(COMPOSE) up -d --build

down: ## docker compose: stop the stack
	$(COMPOSE) down

logs: ## docker compose: follow the logs
	$(COMPOSE) logs -f --tail=100

bench: install ## Benchmarks: print tables, write bench/RESULTS.md
	@$(PY) -m bench.run

chaos: install ## Chaos run: kills and restarts under load, write bench/CHAOS.md
	@$(PY) -m bench.chaos

chaos-smoke: install ## A short chaos run (CI)
	@$(PY) -m bench.chaos --smoke

fuzz: install ## schemathesis over the OpenAPI schema and hostile webhook input (NANOFLEET_FUZZ_EXAMPLES=25)
	@$(PY) -m pytest -q tests/fuzz

properties: install ## Every hypothesis property test, 10x examples (NANOFLEET_HYPOTHESIS_PROFILE=thorough)
	@NANOFLEET_HYPOTHESIS_PROFILE=$${NANOFLEET_HYPOTHESIS_PROFILE:-thorough} $(PY) -m pytest -q -m property
