# Every public target does its own set-up first, so a fresh clone needs nothing else.
SHELL := /bin/bash
# Python's bytecode caches stay on even where the environment turns them off: the suite starts
# a thousand Python processes (brokers, the CLI, clients), and each recompiled the package from
# source (a third of a second each), and pytest rewrote every test module's asserts again.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup system-deps kafka-deps bench-deps bench bench-quick bench-cluster lint kafka clean

run: setup
	$(PY) -m stratalog.pipeline.flights

test: setup kafka-deps
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/pytest -n 3 --dist loadgroup

setup: system-deps $(STAMP)

system-deps:
	@bash scripts/install-system-deps.sh

# Apache Kafka (the reference peer) and the applications tests/apps/ runs (Kafka Streams, Kafka
# Connect) from Maven Central, into ~/.cache/stratalog; reused after. A failure stops the build.
kafka-deps: $(STAMP)
	@$(PY) -c 'from stratalog.peers.kafka import resolve_kafka; print("Apache Kafka jars in", resolve_kafka())'
	@$(PY) -c 'from stratalog.peers.kafka import resolve_kafka_apps; print("Kafka Streams and Connect jars in", *resolve_kafka_apps().values())'

$(STAMP): pyproject.toml setup.py src/stratalog/client/_columns.c src/stratalog/storage/_key_scan.c src/stratalog/kafka_varint.h
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

# The benchmark's peers (NATS, Redis, fio) are system packages that setup installs too.
bench-deps: setup kafka-deps

# Every workload in bench/workloads/ on Stratalog and its peers; results in bench-results/.
bench: bench-deps
	$(VENV)/bin/stratalog bench

bench-quick: bench-deps
	$(VENV)/bin/stratalog bench --quick

# The cluster workloads (three brokers of Stratalog against three of Kafka) at full size, as
# docs/benchmarks.md records them: ingest medians of 3 rounds, then failover and rejoin trials.
bench-cluster: bench-deps
	$(VENV)/bin/stratalog bench rf3 rf3-kera --runs 3 -o bench-results/cluster-ingest
	$(VENV)/bin/stratalog bench failover rejoin -o bench-results/cluster-failover

lint: setup
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build dist src/*.egg-info

# Starts the reference Apache Kafka (resolved from Maven Central on first use) and prints its
# bootstrap address; Ctrl-C stops it.
kafka: setup
	$(PY) -m stratalog.peers.kafka
