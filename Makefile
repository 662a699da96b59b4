# sume-poller: everything a fresh machine needs, from the package index only.
#   make demo   - start Redis, moto and the Sume simulator; run jobs through the handlers
#   make test   - lint, type-check, sam validate --lint, sam build, then the whole test suite
PYTHON ?= python3.11
VENV   := .venv
SAMVENV := .venv-sam
PY     := $(VENV)/bin/python
SAM    := $(SAMVENV)/bin/sam
export SAM_CLI_TELEMETRY := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test lint typecheck sam-validate sam-build unit integration demo sim invoke bench clean

$(VENV)/.installed: requirements-dev.txt layers/sume_poller/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# aws-sam-cli pins boto3 and friends: it gets a virtualenv of its own.
$(SAMVENV)/.installed:
	$(PYTHON) -m venv $(SAMVENV)
	$(SAMVENV)/bin/pip install -q --upgrade pip
	$(SAMVENV)/bin/pip install -q aws-sam-cli
	touch $@

setup: $(VENV)/.installed $(SAMVENV)/.installed
	./scripts/ensure-redis.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

sam-validate: $(SAMVENV)/.installed
	$(SAM) validate --lint

sam-build: $(SAMVENV)/.installed
	$(SAM) build

unit: $(VENV)/.installed
	$(PY) -m pytest -m "not integration and not e2e"

test: setup lint typecheck sam-validate sam-build
	$(PY) -m pytest

demo: setup
	$(PY) -m tools.demo $(DEMO_ARGS)

sim: $(VENV)/.installed
	$(PY) -m tools.sume_sim --port 8787

# Docker-free `sam local invoke`: make invoke FN=SubmitFunction EVENT=events/submit_image.json [ENV=env.json]
invoke: $(VENV)/.installed
	$(PY) -m tools.local_invoke $(FN) -e $(EVENT) $(if $(ENV),--env-vars $(ENV))

clean:
	rm -rf .aws-sam .scratch .pytest_cache .mypy_cache .ruff_cache
