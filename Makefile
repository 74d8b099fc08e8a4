# One-command set-up: `make test` and `make bench` create .venv on first use.
#
# CPU (default): the CPU build of torch, JAX's CPU build.
# GPU: override the two install specs, e.g.
#   make setup TORCH_INSTALL="torch --index-url https://download.pytorch.org/whl/cu126" \
#              JAX_INSTALL="jax[cuda12]"
PYTHON        ?= python3
VENV          ?= .venv
TORCH_INSTALL ?= torch==2.13.0
JAX_INSTALL   ?= jax
EXTRAS        ?= test,baselines
PYTEST_ARGS   ?=
BENCH_ARGS    ?=

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test bench clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_INSTALL) $(JAX_INSTALL)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

setup: $(STAMP)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) bench-results .pytest_cache
