# sume-poller: everything a fresh machine needs, from the package index only.
#   make demo          - sam build + sam deploy of template.yaml into ministack (no Docker), with
#                        Redis and the Sume simulator; submit jobs, watch them live, print a summary
#   make demo-handlers - the same jobs through the handlers in-process on moto server (no deploy)
#   make test          - lint, type-check, sam validate --lint, sam build, then the whole test suite
#                        (including the end-to-end test that deploys into ministack)
PYTHON ?= python3.11
VENV   := .venv
SAMVENV := .venv-sam
MSVENV := .venv-ministack
PY     := $(VENV)/bin/python
SAM    := $(SAMVENV)/bin/sam
export SAM_CLI_TELEMETRY := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test lint typecheck sam-validate sam-build unit integration e2e demo demo-handlers sim invoke bench clean

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

# ministack pins botocore exactly: its own virtualenv, installed in ONE pip command so the pin
# holds. boto3 must be in it: the deployed Lambdas run on ministack's own interpreter.
$(MSVENV)/.installed:
	$(PYTHON) -m venv $(MSVENV)
	$(MSVENV)/bin/pip install -q --upgrade pip
	$(MSVENV)/bin/pip install -q ministack boto3 aws-sam-translator
	touch $@

setup: $(VENV)/.installed $(SAMVENV)/.installed $(MSVENV)/.installed
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

e2e: setup
	$(PY) -m pytest -m e2e

# DEMO_ARGS="--jobs 100 --time-scale 0.3" to change the run; see python -m tools.demo --help
demo: setup
	$(PY) -m tools.demo $(DEMO_ARGS)

demo-handlers: setup
	$(PY) -m tools.demo --backend handlers $(DEMO_ARGS)

sim: $(VENV)/.installed
	$(PY) -m tools.sume_sim --port 8787

# Docker-free `sam local invoke`: make invoke FN=SubmitFunction EVENT=events/submit_image.json [ENV=env.json]
invoke: $(VENV)/.installed
	$(PY) -m tools.local_invoke $(FN) -e $(EVENT) $(if $(ENV),--env-vars $(ENV))

# Benchmarks (issue #4): each figure a ratio against its baseline, measured in the same run.
# Table on stdout and in .scratch/bench-results.md. BENCH_ARGS="--quick" (or --only 1,2 ...); python -m bench --help
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf .aws-sam .scratch .pytest_cache .mypy_cache .ruff_cache
