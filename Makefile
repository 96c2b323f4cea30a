# botmesh — `make help` lists the targets. CI runs `make test` (see .ci/run).
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KAFKA := deploy/kafka/kafka.sh

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z][a-z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(BIN)/botmesh: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/botmesh ## create the virtualenv and install botmesh with its dev tools

kafka-jars: ## fetch the Apache Kafka broker jars from Maven Central (cached)
	$(KAFKA) fetch

kafka-start: kafka-jars ## start the local single-node Kafka on 127.0.0.1:9092
	$(KAFKA) start

kafka-stop: ## stop the local Kafka
	$(KAFKA) stop

APP ?= botmesh.examples.echo_bot:bot
# RUN_ARGS=--once: exit after the summary (status 1 unless every receipt came back in order)
RUN_ARGS ?=

run: venv kafka-jars ## the demo: Kafka, topics, a worker running APP (default the echo bot), traffic, receipts (Ctrl-C stops; RUN_ARGS=--once ends after the summary)
	$(BIN)/python -m botmesh.examples.demo --app $(APP) $(RUN_ARGS)

# Parallel test processes: the tests mostly wait on brokers, servers and worker processes,
# so twice the cores keeps a 2-core machine busy without starving the broker.
TEST_WORKERS ?= 4
SOAK_MINUTES ?= 10
# A test process that crashes (a native library's abort) fails its test and ends the run:
# pytest-xdist would otherwise start another process and, with --dist loadgroup, wait for
# the crashed one's group forever.
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0

test: venv kafka-jars ## the whole test suite in parallel (TEST_WORKERS=4), Kafka tests included
	$(BIN)/pytest $(PYTEST_PARALLEL)

soak: venv kafka-jars ## the long loops (kills, fresh starts, crash cases) pass after pass for SOAK_MINUTES (10); SOAK_ARGS: more pytest arguments
	$(BIN)/python -m tests.soak --minutes $(SOAK_MINUTES) -- $(PYTEST_PARALLEL) $(SOAK_ARGS)

lint: venv ## ruff and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: venv ## the docs site into site/ (mkdocs build --strict: a broken link or a missing page fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict -d site

schemas: venv ## regenerate botmesh/topics/schemas/*.json from the message model (botmesh/state/messages.py)
	$(BIN)/python -m botmesh.topics.schemas

dist: venv ## the sdist and the wheel into dist/, checked (twine, LICENSE, metadata) and run from a fresh venv
	$(BIN)/python -m tests.dist --out dist

# bench_scale.py (a million retained inbounds: minutes) runs only with BENCH_SCALE=1.
BENCH_SCALE ?=

bench: venv quix-venv ## benchmarks (ratios against a baseline in the same run); BENCH_SCALE=1 adds the scale one
	@for b in bench/bench_*.py; do \
	  if [ "$$b" = bench/bench_scale.py ] && [ -z "$(BENCH_SCALE)" ]; then echo "== $$b: skipped (BENCH_SCALE=1 runs it)"; continue; fi; \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; done

# bench_worker's Quix Streams side runs in its own venv: quixstreams 3.28 needs
# confluent-kafka < 2.13, botmesh pins 2.16 (without the floor pip picks an unrelated 0.5.7).
QUIX_VENV := .venv-quix

quix-venv: ## the separate virtualenv (.venv-quix) of bench_worker's Quix Streams side
	@test -x $(QUIX_VENV)/bin/python || $(PY) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/pip install -q 'quixstreams>=3.28,<3.29'

.PHONY: help venv kafka-jars kafka-start kafka-stop run test soak lint docs schemas dist bench quix-venv
