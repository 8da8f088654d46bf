# Sluice — the two commands that matter are `make run` and `make test`; both
# start from a fresh Debian machine and install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
PKGS     := github.com/sluicehq/sluice/...
SERVICES := scripts/services.sh
VENV     := .services/venv
# The test virtualenv's packages are locked with hashes in PY_LOCK (chdb
# checks the migrations on a current ClickHouse, openai is the official
# client the gateways are tested with, LiteLLM the proxy the Python SDK's
# hook is tested in; why each pin, in sdk/python/requirements-test.in), and
# the Python SDK is installed editable from this checkout. A change of the
# lock, of the SDK's pyproject.toml or of the checkout's path reinstalls
# (the stamp names them).
PY_LOCK  := sdk/python/requirements-test.txt
PY_STAMP := $(VENV)/.deps-$(shell cat $(PY_LOCK) sdk/python/pyproject.toml | cksum | cut -d' ' -f1)-$(shell printf '%s' '$(CURDIR)' | cksum | cut -d' ' -f1)
# Tests find the services at the script's default addresses (override with
# the variables `scripts/services.sh env` prints) and Python here:
export SLUICE_CHDB_PYTHON ?= $(CURDIR)/$(VENV)/bin/python
export SLUICE_OPENAI_PYTHON ?= $(CURDIR)/$(VENV)/bin/python

.PHONY: help run test unit e2e pytest bench bench-again bench-peers lint build services services-down pyenv chdb clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

run: build ## the main job: the whole pipeline, a mock LLM, a gateway, load and a live view (Ctrl-C stops)
	$(SERVICES) up clickhouse redis alertmanager
	bin/sluice demo

test: services pyenv ## every test of every module against the real services (-race), and the Python SDK's (mypy --strict first)
	cd sdk/python && $(CURDIR)/$(VENV)/bin/python -m mypy
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider sdk/python
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

pytest: services pyenv ## the Python SDK's type check (mypy, strict; pyproject.toml [tool.mypy]) and tests alone (also part of make test)
	cd sdk/python && $(CURDIR)/$(VENV)/bin/python -m mypy
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider sdk/python

e2e: services pyenv ## the end-to-end, fault and bad-input suites alone (also part of make test)
	$(GO) test -race -count=1 -timeout 20m ./e2e/...

unit: ## tests that need no service (-short)
	$(GO) test -short -count=1 $(PKGS)

# make bench runs the packages' benchmarks one package at a time (go test
# -bench over many packages runs several test binaries at once) and records
# beside each figure what else the machine ran meanwhile; cmd/benchreport
# and bench/README.md say how. bench-again reruns some of them
# (BENCH_PKGS, BENCH: go test's -bench pattern) and merges their figures
# into bench/results.json, keeping the others.
BENCH      ?= .
BENCH_PKGS ?= $(PKGS)
# Peers measured side by side with Sluice (bench/peers/<name>) are modules
# of their own, so that their dependencies stay out of Sluice's go.mod:
# benchreport runs each from its folder without the workspace
# (GOWORK=off), into bench/raw-peer-<name>.txt, after Sluice's own
# packages. bench-peers runs them alone and merges their figures.
BENCH_PEERS ?= bench/peers/gubernator bench/peers/envoyratelimit
RUN_PEERS = rm -f bench/raw-peer-*.txt; for m in $(BENCH_PEERS); do \
	  (cd $$m && GOWORK=off $(GO) run github.com/sluicehq/sluice/cmd/benchreport run \
	    -raw $(CURDIR)/bench/raw-peer-$$(basename $$m).txt -bench '$(BENCH)' ./...) || st=$$?; done

bench: services ## every benchmark, one package at a time, then the peers'; writes bench/results.json and prints a table
	mkdir -p bench
	st=0; $(GO) run ./cmd/benchreport run -raw bench/raw.txt -bench '$(BENCH)' $(PKGS) || st=$$?; \
	$(RUN_PEERS); \
	cat bench/raw.txt $$(ls bench/raw-peer-*.txt 2>/dev/null) | $(GO) run ./cmd/benchreport -in - -out bench/results.json; exit $$st

bench-peers: services ## the peers' benchmarks alone (BENCH_PEERS, BENCH), merged into bench/results.json
	mkdir -p bench
	st=0; $(RUN_PEERS); \
	cat /dev/null $$(ls bench/raw-peer-*.txt 2>/dev/null) | $(GO) run ./cmd/benchreport -merge -in - -out bench/results.json; exit $$st

bench-again: services ## some benchmarks again (BENCH_PKGS=./schemas/ BENCH=DecodeSignal), merged into bench/results.json
	mkdir -p bench
	st=0; $(GO) run ./cmd/benchreport run -raw bench/raw-again.txt -bench '$(BENCH)' $(BENCH_PKGS) || st=$$?; \
	$(GO) run ./cmd/benchreport -merge -in bench/raw-again.txt -out bench/results.json; exit $$st

lint: ## go vet and staticcheck over every module
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

build: ## build sluice and sluicectl into bin/
	$(GO) build -o bin/ ./cmd/sluice ./cmd/sluicectl

services: ## start Kafka, ClickHouse, Redis, the Redis Cluster and Alertmanager (idempotent)
	$(SERVICES) up

services-down: ## stop every service the script started
	$(SERVICES) down

pyenv: $(PY_STAMP) ## the test virtualenv: the hashed lock (chdb, openai, anthropic, google-genai, LiteLLM, pytest) and the Python SDK, editable

chdb: pyenv ## the test virtualenv (old name of pyenv)

# The SDK is built without build isolation, by the lock's setuptools, so
# nothing is fetched that the lock does not hash.
$(PY_STAMP):
	test -x $(VENV)/bin/python || python3 -m venv $(VENV) || { apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --require-hashes -r $(PY_LOCK)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e sdk/python
	rm -f $(VENV)/.deps-* && touch $@

clean: ## remove build output (service data stays; see scripts/services.sh reset)
	rm -rf bin
