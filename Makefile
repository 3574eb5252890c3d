# teller: one Makefile does all set-up. On a fresh machine: `make demo` then `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Benchmarks and tests must not fight over 2 cores with an oversubscribed BLAS.
export OMP_NUM_THREADS ?= 2

RUST_SRC := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml pyproject.toml
PY_SRC := $(shell find python -name '*.py' -o -name '*.pyi' -o -name '*.json' -o -name '*.yaml')

.PHONY: help venv build demo test test-rust test-py bench lint fmt clean

help:
	@echo "make demo   - create .venv, install pinned deps, build (release), run the main job"
	@echo "make test   - the full test suite (cargo test + pytest)"
	@echo "make bench  - benchmarks against the peers (results in docs/benchmarks.md)"
	@echo "make lint   - ruff, cargo fmt --check, clippy -D warnings"

# --- environment -------------------------------------------------------------------------------
# torch is installed first and alone from requirements/torch.txt (the one place it is pinned);
# everything after that gets the same file as a constraint, so no resolver can pull a second copy.
$(VENV)/.deps: requirements/torch.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements/torch.txt
	$(PIP) install -q -c requirements/torch.txt -r requirements/dev.txt
	touch $@

venv: $(VENV)/.deps

# --- build ---------------------------------------------------------------------------------------
# Release build of the extension (fat LTO), installed into .venv in development mode.
$(VENV)/.built: $(VENV)/.deps $(RUST_SRC)
	$(VENV)/bin/maturin develop --release
	$(PY) -c "import teller, sys; assert teller.build_profile == 'release', teller.build_profile; print('built teller', teller.__version__, teller.build_profile)"
	touch $@

build: $(VENV)/.built

# --- main job ------------------------------------------------------------------------------------
DEMO_TRACE := tests/data/traces/a100_nccl_2rank.kineto.json.gz
demo: build
	@mkdir -p output/demo
	$(VENV)/bin/teller doctor
	$(VENV)/bin/teller trace convert $(DEMO_TRACE) -o output/demo/trace.json.gz
	$(VENV)/bin/teller trace summary output/demo/trace.json.gz --top 8
	@echo
	@echo "Perfetto-ready trace: $(abspath output/demo/trace.json.gz)  (open it at https://ui.perfetto.dev)"

# --- tests ---------------------------------------------------------------------------------------
test: build test-rust test-py

test-rust:
	cargo test -p teller-core --quiet

test-py: build
	$(PY) -m pytest -q tests

# --- benchmarks ----------------------------------------------------------------------------------
$(VENV)/.bench-deps: $(VENV)/.deps requirements/bench.txt
	$(PIP) install -q -c requirements/torch.txt -r requirements/bench.txt
	touch $@

bench: build $(VENV)/.bench-deps
	$(PY) benches/bench_parse.py --out docs/benchmarks-parse.json

# --- lint ----------------------------------------------------------------------------------------
lint: $(VENV)/.deps
	$(VENV)/bin/ruff check python tests benches
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt: $(VENV)/.deps
	$(VENV)/bin/ruff check --fix python tests benches
	cargo fmt --all

clean:
	cargo clean
	rm -rf $(VENV) output build dist
