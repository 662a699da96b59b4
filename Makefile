# sume-poller. The Makefile owns the virtualenvs: Python code never installs packages, it fails
# with "... missing: run make setup". Every service a target needs (redis-server, moto, ministack,
# the Sume simulator) is started by the tools themselves on free 127.0.0.1 ports. No Docker.
#
#   make setup             the virtualenvs (uv's, then the four others in parallel) and redis-server
#   make lint              ruff, mypy, sam validate --lint (cfn-lint), checkov (offline); -j4 at once
#   make build             sam build
#   make test              lint, the docs, build and the unit, integration and e2e tiers, all at
#                          once (each logged to .scratch/logs/<step>.log, printed as it finishes)
#   make docs              the documentation site (docs/, mkdocs.yml), built strictly into .scratch/site
#   make test-unit | test-integration | test-e2e
#   make demo              jobs through template.yaml deployed into ministack (DEMO_ARGS="--backend
#                          inprocess --jobs 100 --time-scale 0.05 --param ReadsPerMinute=600")
#   make bench             benchmarks (BENCH_ARGS="--quick")
#   make invoke FN=SubmitFunction EVENT=events/submit_image.json   Docker-free sam local invoke
#   make sim               the Sume simulator on :8787
#   make simulation        the interleaving simulation (tests/sim): SCHEDULES schedules from seed FIRST
#                          (default 1000 from 1; WORKERS processes), or SEED=1234 to replay one step by step
#   make status | models | redrive   a deployed stack: counts, the learned model per kind, DLQ
#                          redrive (DLQ=poll|terminal-queue|terminal-target; STACK=name,
#                          CONFIG_ENV=default|dev|prod; with
#                          AWS_ENDPOINT_URL=... against ministack)
#   make migrate-keys      the key configuration's inline secrets moved to secrets of their own
#                          (then FINISH=1 after deploying; README "Many keys")
#   make logs FN=PollFunction   sam logs of a deployed stack's function
#   make clean
PYTHON  ?= python3.11
VENV    := .venv
SAMVENV := .venv-sam
MSVENV  := .venv-ministack
CKVENV  := .venv-checkov
UVVENV  := .venv-uv
V313VENV := .venv-313
PY      := $(VENV)/bin/python
# Python entry points import the layer's package as Lambda does from /opt/python (pytest has
# the same path in pyproject.toml). Not exported: ministack's Lambdas must use the built layer.
PYRUN   := PYTHONPATH=layers/sume_poller $(PY)
SAM     := $(SAMVENV)/bin/sam
VENVS   := $(VENV)/.installed $(SAMVENV)/.installed $(MSVENV)/.installed $(CKVENV)/.installed \
           $(V313VENV)/.installed
CONFIG_ENV ?= default
FN      ?= PollFunction
EVENT   ?= events/submit_image.json
export SAM_CLI_TELEMETRY := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Python writes its bytecode caches, whatever the environment says (a machine may set this to keep
# checkouts clean; they go to ignored __pycache__ folders): a test run starts dozens of Python
# processes that import the same packages, and compiling them anew in each cost the integration
# tier alone about 55 of its 266 CPU-seconds.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-dev setup-e2e setup-lint redis lint lint-ruff lint-mypy lint-sam lint-checkov docs build test test-unit test-integration test-e2e demo bench invoke sim status \
        models redrive migrate-keys logs clean simulation

# -- virtualenvs: each is (re)installed when its requirements change, else left alone ------------
# $(call venv,DIR,PIP-ARGS): scripts/venv.sh creates DIR if needed, installs with uv (log in
# .scratch/logs/DIR.log) and marks it installed, one install per virtualenv at a time.
venv = @./scripts/venv.sh $(1) $(PYTHON) "$(2)" $(filter-out $(UVVENV)/.installed,$^)

# The installer of the others (uv: pip's resolver and serial downloads took 70-350 s a virtualenv).
$(UVVENV)/.installed: scripts/requirements-uv.txt
	$(call venv,$(UVVENV),-r scripts/requirements-uv.txt)

$(VENV)/.installed: requirements-dev.txt layers/sume_poller/requirements.txt \
                    layers/sume_poller/requirements-tracing.txt $(UVVENV)/.installed
	$(call venv,$(VENV),-r requirements-dev.txt)

# aws-sam-cli pins boto3 and friends: a virtualenv of its own (cfn-lint lives here too).
$(SAMVENV)/.installed: scripts/requirements-sam.txt $(UVVENV)/.installed
	$(call venv,$(SAMVENV),-r scripts/requirements-sam.txt)

# ministack pins botocore exactly: one install command, so the pin holds.
$(MSVENV)/.installed: scripts/requirements-ministack.txt $(UVVENV)/.installed
	$(call venv,$(MSVENV),-r scripts/requirements-ministack.txt)

# checkov pins boto3 exactly: a virtualenv of its own.
$(CKVENV)/.installed: scripts/requirements-checkov.txt $(UVVENV)/.installed
	$(call venv,$(CKVENV),-r scripts/requirements-checkov.txt)

# Lambda's python3.13 runtime: Python 3.13 with the runtime's boto3, compiled at install like the
# runtime's own (what runs on it starts with -B, as on Lambda's read-only /opt). Bench figure 4's
# cold starts and the e2e tier's check of the built layer's bytecode run on it. The interpreter is
# the one the layer's build compiles with (layers/sume_poller/Makefile finds it: PATH or pyenv).
PY313 = $(shell $(MAKE) -s --no-print-directory -C layers/sume_poller python313)
$(V313VENV)/.installed: scripts/requirements-313.txt $(UVVENV)/.installed
	@test -n "$(PY313)" || { echo "no Python 3.13 (python3.13 on PATH or pyenv's versions/3.13*): install it"; exit 1; }
	@./scripts/venv.sh $(V313VENV) $(PY313) "--compile-bytecode -r scripts/requirements-313.txt" \
		$(filter-out $(UVVENV)/.installed,$^)

# The benchmarks' plotting and fitting packages, only for make bench.
$(VENV)/.bench-installed: bench/requirements.txt $(VENV)/.installed
	@MARK=.bench-installed ./scripts/venv.sh $(VENV) $(PYTHON) "-r bench/requirements.txt" $^

# The documentation site's packages (mkdocs and its Material theme), only for make docs and make test.
$(VENV)/.docs-installed: scripts/requirements-docs.txt $(VENV)/.installed
	@MARK=.docs-installed ./scripts/venv.sh $(VENV) $(PYTHON) "-r scripts/requirements-docs.txt" $^

setup:
	@$(MAKE) --no-print-directory -j4 $(VENVS) redis

redis:
	@./scripts/ensure-redis.sh

# -- checks ------------------------------------------------------------------------------------
# Four independent checks: `make -j4 lint` runs them side by side (make test does, with each
# check's output kept together).
lint: lint-ruff lint-mypy lint-sam lint-checkov

lint-ruff: $(VENV)/.installed
	$(VENV)/bin/ruff check .

lint-mypy: $(VENV)/.installed
	$(VENV)/bin/mypy

lint-sam: $(SAMVENV)/.installed
	$(SAM) validate --lint

lint-checkov: $(CKVENV)/.installed
	$(CKVENV)/bin/checkov -f template.yaml --framework cloudformation --compact --quiet --skip-download

# Strict: a link to a missing page or anchor, or a page missing from the nav, fails the build
# (mkdocs.yml's validation). Not --quiet: mkdocs 1.6 then stops counting warnings, and strict mode
# passes a broken link. NO_MKDOCS_2_WARNING: Material's banner about its successor, not about us.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# SUME_UV: the layer's Makefile installs its packages with uv (see layers/sume_poller/Makefile).
build: $(SAMVENV)/.installed
	SUME_UV=$(CURDIR)/scripts/uv.sh $(SAM) build

test-unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit -m "not integration and not e2e"

test-integration: $(VENV)/.installed redis
	$(PY) -m pytest tests/integration -m integration -n 6 --dist loadfile

test-e2e: setup
	$(PY) -m pytest tests/e2e -m e2e -n 2

# The checks (lint, the docs site) and all three tiers run at once, each into its own log,
# printed when it finishes. Each starts as soon as what it needs is installed, in three chains
# side by side: unit and integration once .venv is in (the critical path: the integration tier is
# CPU-bound); build and e2e once the SAM and ministack virtualenvs are (installed at a lower CPU
# priority: the e2e tier mostly waits on deployed Lambdas, so it has slack); lint and the docs
# once checkov's and the docs packages are (those installs mostly wait on the package index, so
# they start at once). (e2e builds the template itself, into a directory of its own: .scratch/stack/builds/src-<digest of the sources>, one build its workers share.)
test: redis
	@./scripts/run-tiers.sh @setup-dev unit integration , @setup-e2e build e2e , @setup-lint lint docs simulation

setup-dev: $(VENV)/.installed

setup-e2e:
	@$(MAKE) --no-print-directory -j4 $(VENV)/.installed $(SAMVENV)/.installed $(MSVENV)/.installed \
		$(V313VENV)/.installed

setup-lint:
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed $(CKVENV)/.installed $(VENV)/.docs-installed

# -- running it --------------------------------------------------------------------------------
demo: setup
	$(PYRUN) -m tools.demo $(DEMO_ARGS)

bench: setup $(VENV)/.bench-installed
	$(PYRUN) -m bench $(BENCH_ARGS)

# Docker-free `sam local invoke`; env.json points the functions at local endpoints (Sume on
# :8787 from make sim, Redis on :6379, AWS at $$AWS_ENDPOINT_URL). RedisUrl has no default in
# the template, so the template needs a value to resolve at all; env.json's REDIS_URL wins.
invoke: $(VENV)/.installed
	$(PY) -m tools.local_invoke $(FN) -e $(EVENT) --env-vars env.json \
		--parameter-overrides RedisUrl=redis://127.0.0.1:6379/0 LocalEndpoints=true

sim: $(VENV)/.installed
	$(PYRUN) -m tools.sume_sim --port 8787

# The interleaving simulation: many seeds, or one (SEED) replayed with its plan, steps and violations.
SCHEDULES ?= 1000
FIRST ?= 1
WORKERS ?= 1
simulation: $(VENV)/.installed
	$(PYRUN) -m tests.sim $(if $(SEED),--seed $(SEED) --replay,--schedules $(SCHEDULES) --first $(FIRST) --workers $(WORKERS))

status: $(VENV)/.installed
	$(PYRUN) -m tools.ops status --config-env $(CONFIG_ENV) $(if $(STACK),--stack $(STACK))

models: $(VENV)/.installed
	$(PYRUN) -m tools.ops models --config-env $(CONFIG_ENV) $(if $(STACK),--stack $(STACK))

redrive: $(VENV)/.installed
	$(PYRUN) -m tools.ops redrive --config-env $(CONFIG_ENV) $(if $(STACK),--stack $(STACK)) $(if $(DLQ),--dlq $(DLQ))

# The key configuration's inline secrets to secrets of their own (FINISH=1 after deploying; README "Many keys").
migrate-keys: $(VENV)/.installed
	$(PYRUN) -m tools.ops migrate-keys --config-env $(CONFIG_ENV) $(if $(STACK),--stack $(STACK)) $(if $(FINISH),--finish)

logs: $(SAMVENV)/.installed
	$(SAM) logs --config-env $(CONFIG_ENV) -n $(FN) $(if $(STACK),--stack-name $(STACK)) $(LOGS_ARGS)

clean:
	rm -rf .aws-sam .scratch .pytest_cache .mypy_cache .ruff_cache
