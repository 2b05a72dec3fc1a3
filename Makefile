# llmfleet.vllm developer entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
COLL_LINK := .ansible/collections/ansible_collections/llmfleet/vllm
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv lock lint sanity unit check integration molecule test demo testbed build clean bench bench-smoke

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(BIN)/ansible: requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# --no-compile: a fresh venv's bytecode of every file (the ansible package's collections most of all) took 20 of
	# the install's 30 s; what runs compiles its own modules on first import (docs/testbed.md).
	$(BIN)/pip install -q --no-compile -r requirements/dev.txt
	touch $@

$(COLL_LINK):
	mkdir -p $(dir $(COLL_LINK))
	ln -sfn ../../../.. $(COLL_LINK)

venv: $(BIN)/ansible $(COLL_LINK) ## install pinned tooling into .venv and link the collection in

lock: ## re-resolve requirements/dev.in into requirements/dev.txt
	rm -rf build/lockvenv && $(PYTHON) -m venv build/lockvenv
	build/lockvenv/bin/pip install -q -r requirements/dev.in
	{ echo "# Generated from requirements/dev.in by 'make lock' (pip freeze of a clean venv). Do not edit by hand."; \
	  build/lockvenv/bin/pip freeze --exclude-editable; } > requirements/dev.txt

lint: venv ## yamllint and ansible-lint (production profile)
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production

sanity: venv ## ansible-test sanity from an ansible_collections/llmfleet/vllm copy
	tools/sanity.sh build/sanity --requirements

PYTEST_UNIT_OPTS ?=
unit: venv ## unit tests (pytest; PYTEST_UNIT_OPTS="-n 2": two workers)
	$(BIN)/pytest -q $(PYTEST_UNIT_OPTS) tests/unit

check: lint sanity unit ## the fast loop for contributors: lint, sanity and unit tests (a few minutes, no test host)

integration: venv ## module and playbook integration tests on real files, processes, servers and systemd hosts
	$(BIN)/pytest -q tests/integration

MOLECULE_SCENARIOS ?= $(shell ls molecule | grep -v -e "^_" -e "^default$$")
molecule: venv ## every molecule scenario (converge, idempotence, verify) on nspawn systemd hosts (MOLECULE_SCENARIOS="a b": those)
	rc=0; for s in $(MOLECULE_SCENARIOS); do \
	  echo "=== molecule scenario $$s ($$(date -u +%T))"; $(BIN)/molecule test -s $$s || rc=1; done; exit $$rc

bench: venv testbed ## every benchmark under bench/ with its defaults (about 3 h; figures in docs/benchmarks.md)
	$(BIN)/python bench/verify.py
	$(BIN)/python bench/client.py
	$(BIN)/python bench/pivot.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/traffic.py
	$(BIN)/python bench/repeats.py

bench-smoke: venv ## the benches without a test host, tiny sizes: they still run (no time is asserted)
	mkdir -p tests/output
	$(BIN)/python bench/verify.py --size-gb 0.05 --shards 4 --runs 1 --skip-ansible --output tests/output/bench-verify.md
	$(BIN)/python bench/client.py --no-vllm --concurrency 8 --runs 1 --output-len 16 --min-prompts 16 \
	  --out tests/output/bench-client.json

testbed: ## build the cached systemd test-host rootfs
	tools/testbed/testbed.sh build

test: venv ## everything CI runs: lint, sanity, unit, then integration and molecule side by side
	tools/run-tests.sh

demo: venv testbed ## pivot a local systemd test host between two tiny models on the vLLM CPU engine
	tools/demo.sh

build: venv ## build the collection tarball
	$(BIN)/ansible-galaxy collection build --force

clean: ## remove build outputs (keeps the test-bed cache in /var/cache/llmfleet-testbed)
	rm -rf build .ansible llmfleet-vllm-*.tar.gz tests/output
