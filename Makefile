# FleetRL: `make test` and `make demo` each do the whole set-up (venv, installs) themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SGLANG_FRONTEND := 0.5.23
OPENRLHF_CLIENT := 0.11.2
DEEPSPEED_VERSION := 0.19.8
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints/cpu.txt | cksum | cut -d' ' -f1)
DS_STAMP := $(VENV)/deepspeed-site/.installed-$(DEEPSPEED_VERSION)
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: install test test-fast test-slow test-bench test-gpu docs demo demo-agent bench lint clean

$(STAMP): pyproject.toml constraints/cpu.txt
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 10), "FleetRL needs Python >= 3.10"'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints/cpu.txt -e '.[learner,dev]'
	# SGLang's frontend (tests/rollout/clients: sgl.RuntimeEndpoint against /generate) without its server's
	# dependencies (CUDA kernels, its own torch / transformers pins): what its client imports is in the dev extra
	$(BIN)/python -m pip install -q --no-deps 'sglang==$(SGLANG_FRONTEND)'
	# OpenRLHF's remote reward client (tests/reward/test_score_api.py) without its training stack (Ray, DeepSpeed, vLLM)
	$(BIN)/python -m pip install -q --no-deps 'openrlhf==$(OPENRLHF_CLIENT)'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# DeepSpeed for the tests that train through the deepspeed backend on CPU (tests/learner/deepspeed_site.py), beside
# the environment, not in it: importable, it is imported by every process that saves a model (accelerate), ~1.5
# CPU-seconds and a stdout line each; its sdist builds no op (DS_BUILD_OPS defaults to 0) and pulls no CUDA package
$(DS_STAMP): $(STAMP)
	rm -rf $(VENV)/deepspeed-site
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-deps --target $(VENV)/deepspeed-site \
		'deepspeed==$(DEEPSPEED_VERSION)' hjson ninja py-cpuinfo einops
	touch $(DS_STAMP)

install: $(STAMP) $(DS_STAMP)

## lint, then the whole CPU suite (what CI runs) on two pytest-xdist workers, a file to a worker (each its own
## Redis, ports leased: shared/ports.py): pytest 465 s on a clean clone here (TEST_WORKERS=3: 374 s; docs/testing.md,
## "Where the suite's time goes"); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: $(STAMP) $(DS_STAMP)
	$(BIN)/ruff check shared services tests benchmarks deploy
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m 'not gpu and not bench' -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 tests

## the benchmark scripts' quick runs (tests/benchmarks: each script runs end to end and prints its rows and ratios);
## not behaviour of the product, so not in `make test`; CI runs it after `make test` (.ci/run)
test-bench: $(STAMP)
	$(BIN)/python -m pytest -q -m bench -n $(TEST_WORKERS) --dist loadfile --durations=10 tests/benchmarks

## the edit loop: unit and in-process tests, no process started (<= 3 min here); tiers: tests/conftest.py
test-fast: $(STAMP)
	FLEETRL_TEST_TIER=fast $(BIN)/python -m pytest -q -m 'not gpu and not slow and not process' --durations=10 tests

## what test-fast leaves out: tests that start processes (`process`) or take over ~30 s (`slow`)
test-slow: $(STAMP) $(DS_STAMP)
	$(BIN)/python -m pytest -q -m '(slow or process) and not gpu and not bench' --durations=20 tests

## the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor is an error
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

## GPU checks (vLLM / SGLang / NCCL / DeepSpeed): run on a machine with a CUDA GPU and the engines
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu tests

## the whole fleet on one machine, training a tiny model until reward rises
demo: $(STAMP)
	$(BIN)/python -m deploy.local.demo

## an agent learns to use a calculator tool: SFT warm-up on tool-use transcripts, then GRPO on multi-turn rollouts
demo-agent: $(STAMP)
	$(BIN)/python -m deploy.local.demo_agent

bench: $(STAMP)
	$(BIN)/python benchmarks/queue_throughput.py

lint: $(STAMP)
	$(BIN)/ruff check shared services tests benchmarks deploy
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache site

## the compose stack for real under podman-compose (CPU images, a few training steps, rollout scaled 1 -> 3 -> 1 mid-run); not in `make test`
compose-test: $(STAMP) $(DS_STAMP)
	$(BIN)/python -m pip install -q 'podman-compose>=1.1'
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m deploy.compose.compose_test

## the Ray launcher on a local CPU Ray cluster (ray is in the `ray` extra; without it the test skips)
test-ray: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints/cpu.txt -e '.[learner,dev,ray]'
	$(BIN)/python -m pytest -q tests/deploy/test_ray_launcher.py tests/deploy/run/test_render.py

.PHONY: compose-test test-ray

## failure drills on the real fleet (kill / stop / restart each component mid-run; one table; ~3 min); not in `make test`
drills: $(STAMP)
	$(BIN)/python -m deploy.local.drills

.PHONY: drills

## wheels an offline GPU host installs from (CPython 3.12, manylinux x86_64) into .whl/; run where there is a network
wheelhouse:
	$(PY) -m deploy.gpu.wheelhouse .whl

## on a host with a CUDA GPU and its own CUDA torch (no network): gpu tests, a GPU recipe through fleetrl run,
## engine throughput; figures to benchmarks/RESULTS-gpu.md (installs .whl/ into .gpu-site/ first)
GPU_PY ?= python3
gpu-check:
	@test -d .whl || { echo "error: no .whl/ wheelhouse: run make wheelhouse where there is a network, then copy .whl/ here"; exit 2; }
	$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --upgrade --target .gpu-site .whl/*.whl
	PYTHONPATH=$(CURDIR)/.gpu-site:$(CURDIR) HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(GPU_PY) -m deploy.gpu.gpu_check

.PHONY: wheelhouse gpu-check
