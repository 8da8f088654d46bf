# Sluice — the two commands that matter are `make run` and `make test`; both
# start from a fresh Debian machine and install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
PKGS     := github.com/sluicehq/sluice/...
SERVICES := scripts/services.sh
VENV     := .services/venv
# The test virtualenv's packages, pinned: chdb checks the migrations on a
# current ClickHouse, openai is the official client the gateway is tested
# with. A change of this list reinstalls (the stamp names it).
PY_DEPS  := chdb==4.4.0 openai==3.57.0
PY_STAMP := $(VENV)/.deps-$(shell printf '%s' '$(PY_DEPS)' | cksum | cut -d' ' -f1)
# Tests find the services at the script's default addresses (override with
# the variables `scripts/services.sh env` prints) and Python here:
export SLUICE_CHDB_PYTHON ?= $(CURDIR)/$(VENV)/bin/python
export SLUICE_OPENAI_PYTHON ?= $(CURDIR)/$(VENV)/bin/python

.PHONY: help run test unit e2e bench lint build services services-down chdb clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

run: build ## the main job: the whole pipeline, a mock LLM, a gateway, load and a live view (Ctrl-C stops)
	$(SERVICES) up clickhouse redis alertmanager
	bin/sluice demo

test: services chdb ## every test of every module against the real services (-race)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

e2e: services chdb ## the end-to-end, fault and bad-input suites alone (also part of make test)
	$(GO) test -race -count=1 -timeout 20m ./e2e/...

unit: ## tests that need no service (-short)
	$(GO) test -short -count=1 $(PKGS)

bench: services ## every benchmark; writes bench/results.json and prints a table
	mkdir -p bench
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS) | tee bench/raw.txt
	$(GO) run ./cmd/benchreport -in bench/raw.txt -out bench/results.json

lint: ## go vet and staticcheck over every module
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

build: ## build sluice and sluicectl into bin/
	$(GO) build -o bin/ ./cmd/sluice ./cmd/sluicectl

services: ## start Kafka, ClickHouse, Redis, the Redis Cluster and Alertmanager (idempotent)
	$(SERVICES) up

services-down: ## stop every service the script started
	$(SERVICES) down

chdb: $(PY_STAMP) ## the test virtualenv: chdb (migrations on current ClickHouse) and the official openai client

$(PY_STAMP):
	test -x $(VENV)/bin/python || python3 -m venv $(VENV) || { apt-get install -y -qq python3-venv && python3 -m venv $(VENV); }
	$(VENV)/bin/pip install --quiet --disable-pip-version-check $(PY_DEPS)
	rm -f $(VENV)/.deps-* && touch $@

clean: ## remove build output (service data stays; see scripts/services.sh reset)
	rm -rf bin
