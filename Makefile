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
SHIM_SRC := $(shell find cupti_shim/src -name '*.[ch]') cupti_shim/build.sh
PY_SRC := $(shell find python -name '*.py' -o -name '*.pyi' -o -name '*.json' -o -name '*.yaml')

.PHONY: help venv build demo test test-rust test-shim test-py bench lint fmt clean

help:
	@echo "make demo   - create .venv, install pinned deps, build (release), run the main job"
	@echo "make test   - the full test suite (cargo test, the shim's C tests, pytest)"
	@echo "make bench  - benchmarks against the peers (docs/benchmarks-*.json; read in docs/benchmarks.md)"
	@echo "make lint   - ruff check + format --check, cargo fmt --check, clippy -D warnings"

# --- environment -------------------------------------------------------------------------------
# torch is installed first and alone from requirements/torch.txt (the one place it is pinned);
# everything after that gets the same file as a constraint, so no resolver can pull a second copy.
# The CUDA wheels are large (torch and its nvidia-* dependencies are ~3 GB) and a dropped connection
# must not fail a fresh set-up. So the wheels are first *downloaded* into $(WHEELS): pip resumes a
# partial file up to 50 times, each download command is retried whole up to 4 times, and a retry
# skips the files already there (pip download keeps complete files only). Then everything is
# installed from that folder with no index at all, so the three installs resolve exactly the files
# downloaded (torch once), and the folder is removed.
WHEELS := $(VENV)/wheels
PIP_NET := --retries 10 --timeout 60 --resume-retries 50
define retry
for attempt in 1 2 3 4; do $(1) && break; \
  if [ $$attempt = 4 ]; then echo "failed 4 times: $(1)" >&2; exit 1; fi; \
  echo "failed (attempt $$attempt), retrying in $$((attempt * 15)) s: $(1)" >&2; sleep $$((attempt * 15)); done
endef
FETCH := $(PIP) download -q $(PIP_NET) --only-binary=:all: -d $(WHEELS)
LOCAL := $(PIP) install -q --no-index --find-links $(WHEELS)

$(VENV)/.deps: requirements/torch.txt requirements/dev.txt requirements/nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call retry,$(PIP) install -q --retries 10 --upgrade pip)
	$(call retry,$(FETCH) -r requirements/torch.txt)
	$(call retry,$(FETCH) -c requirements/torch.txt -r requirements/dev.txt)
	$(call retry,$(FETCH) --no-deps -r requirements/nodeps.txt)
	$(LOCAL) -r requirements/torch.txt
	$(LOCAL) -c requirements/torch.txt -r requirements/dev.txt
	$(LOCAL) --no-deps -r requirements/nodeps.txt
	rm -rf $(WHEELS)
	touch $@

venv: $(VENV)/.deps

# --- build ---------------------------------------------------------------------------------------
# Release build of the extension (fat LTO), installed into .venv in development mode.
$(VENV)/.built: $(VENV)/.deps $(RUST_SRC)
	$(VENV)/bin/maturin develop --release
	$(PY) -c "import teller, sys; assert teller.build_profile == 'release', teller.build_profile; print('built teller', teller.__version__, teller.build_profile)"
	touch $@

# The collector shim, built by teller itself into its cache (keyed by sources, headers, compiler).
$(VENV)/.shim: $(VENV)/.built $(SHIM_SRC)
	$(VENV)/bin/teller shim build
	touch $@

build: $(VENV)/.built $(VENV)/.shim

# --- main job ------------------------------------------------------------------------------------
# The whole path on embedded defaults: a real profiler trace, a real collection of an unmodified
# tiny inference, a simulated labelled dataset, a TPE tokenizer trained on it, tokenized shards.
DEMO := output/demo
DEMO_TRACE := tests/data/traces/a100_nccl_2rank.kineto.json.gz
demo: build
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	@echo "== 1. environment"
	$(VENV)/bin/teller doctor
	@echo "== 2. a real PyTorch-profiler trace (A100, NCCL): convert and summarize"
	$(VENV)/bin/teller trace convert $(DEMO_TRACE) -o $(DEMO)/a100.trace.json.gz
	$(VENV)/bin/teller trace summary $(DEMO)/a100.trace.json.gz --top 5
	@echo "== 3. collect an unmodified tiny GPT-2 inference on this CPU (NVTX injection, module ranges, logs)"
	$(VENV)/bin/teller collect --trace-dir $(DEMO)/collect --nvtx-json transformers -- \
		$(PY) examples/tiny_inference.py --requests 3 --new-tokens 6
	$(VENV)/bin/teller trace summary $(DEMO)/collect/run-* --top 5
	@echo "== 4. simulate a labelled fault dataset, train TPE on its train split, tokenize it"
	$(VENV)/bin/teller dataset generate --output-dir $(DEMO)/dataset --num-samples 520 --seed 0 --preset tiny --workers 2
	$(VENV)/bin/teller dataset validate $(DEMO)/dataset
	$(VENV)/bin/teller tpe train --data-dir $(DEMO)/dataset --output-dir $(DEMO)/tpe-runs --vocab-size 1024 > $(DEMO)/tpe-path
	rm -rf $(DEMO)/tpe && cp -r "$$(cat $(DEMO)/tpe-path)" $(DEMO)/tpe
	$(VENV)/bin/teller tpe inspect $(DEMO)/tpe --top 8
	$(VENV)/bin/teller tokenize --data-dir $(DEMO)/dataset --tokenizer-dir $(DEMO)/tpe --output-dir $(DEMO)/tokens --workers 2
	@echo "== 5. RCA models at demo size: MoT, single-stream, baselines, GBDT x MoT ensemble; evaluate; results table"
	$(VENV)/bin/teller train mot --data-dir $(DEMO)/tokens --tpe-dir $(DEMO)/tpe --output-dir $(DEMO)/checkpoints/mot --config demo
	$(VENV)/bin/teller train single --data-dir $(DEMO)/tokens --tpe-dir $(DEMO)/tpe --output-dir $(DEMO)/checkpoints/single --config demo_single
	$(VENV)/bin/teller train mot --data-dir $(DEMO)/tokens --tpe-dir $(DEMO)/tpe --output-dir $(DEMO)/checkpoints/mot-trace --config demo --modalities trace
	$(VENV)/bin/teller train mot --data-dir $(DEMO)/tokens --tpe-dir $(DEMO)/tpe --output-dir $(DEMO)/checkpoints/mot-log --config demo --modalities log
	$(VENV)/bin/teller train baselines --data-dir $(DEMO)/tokens --output-dir $(DEMO)/checkpoints/baselines
	$(VENV)/bin/teller train ensemble --mot $(DEMO)/checkpoints/mot --baselines $(DEMO)/checkpoints/baselines \
		--output-dir $(DEMO)/checkpoints/ensemble
	for m in mot single mot-trace mot-log baselines ensemble; do \
		for s in test test_ood; do $(VENV)/bin/teller evaluate --checkpoint $(DEMO)/checkpoints/$$m --split $$s > /dev/null; done; done
	$(VENV)/bin/teller results summarize $(DEMO)/checkpoints/* -o output
	@echo "== 6. diagnose a fresh faulty sample and the real collected CPU run"
	$(VENV)/bin/teller dataset generate --output-dir $(DEMO)/fresh --num-samples 13 --seed 101 --preset tiny --train-only > /dev/null
	$(VENV)/bin/teller diagnose "$$(grep -l '"label": "gpu_throttle"' $(DEMO)/fresh/s*/annotation.json | head -1 | xargs dirname)" \
		--checkpoint $(DEMO)/checkpoints/mot --perfetto $(DEMO)/diagnosis-fresh.json.gz
	$(VENV)/bin/teller diagnose "$$(ls -d $(DEMO)/collect/run-* | head -1)" --checkpoint $(DEMO)/checkpoints/mot \
		--perfetto $(DEMO)/diagnosis-collected.json.gz
	@echo
	@echo "Perfetto-ready traces (open at https://ui.perfetto.dev):"
	@echo "  $(abspath $(DEMO))/a100.trace.json.gz"
	@ls -d $(abspath $(DEMO))/collect/run-*/trace.json | sed 's/^/  /'
	@echo "tokenizer: $(abspath $(DEMO))/tpe   dataset: $(abspath $(DEMO))/dataset   shards: $(abspath $(DEMO))/tokens"
	@echo "checkpoints: $(abspath $(DEMO))/checkpoints/{mot,single}   results: $(abspath output)/results.md"

# --- tests ---------------------------------------------------------------------------------------
test: build test-rust test-shim test-py

test-rust:
	cargo test -p teller-core --quiet

# The shim's C test programs (NVTX injection for real, fork, crashes, CUPTI record conversion).
test-shim: $(VENV)/.deps
	bash cupti_shim/tests/run_tests.sh build/cupti_shim $(PY)

test-py: build
	TELLER_REQUIRE_SHIM=1 $(PY) -m pytest -q tests

# --- benchmarks ----------------------------------------------------------------------------------
$(VENV)/.bench-deps: $(VENV)/.deps requirements/bench.txt
	$(PIP) install -q -c requirements/torch.txt -r requirements/bench.txt
	touch $@

bench: build $(VENV)/.bench-deps
	$(PY) benches/bench_parse.py --out docs/benchmarks-parse.json
	$(PY) benches/bench_raw.py --out docs/benchmarks-raw.json
	$(PY) benches/bench_tpe.py --out docs/benchmarks-tpe.json
	$(PY) benches/bench_collect.py --out docs/benchmarks-collect.json
	$(PY) benches/bench_nsys.py --out docs/benchmarks-nsys.json
	$(PY) benches/bench_summary.py --out docs/benchmarks-summary.json

# --- lint ----------------------------------------------------------------------------------------
lint: $(VENV)/.deps
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt: $(VENV)/.deps
	$(VENV)/bin/ruff check --fix python tests benches
	$(VENV)/bin/ruff format python tests benches
	cargo fmt --all

clean:
	cargo clean
	rm -rf $(VENV) output build dist
