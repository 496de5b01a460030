# The two set-up commands of the README: `make demo` and `make test`. Both create .venv,
# install from this project's own files, then run. A GPU user keeps the CUDA torch installed
# in their Python with `make VENV_FLAGS=--system-site-packages TORCH_SPEC= demo` (torch is then
# only required as a range by pyproject.toml).

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.quantgate-installed
TEST_STAMP := $(VENV)/.quantgate-test-installed
DEMO_CONFIG ?= eval_configs/tiny/demo.yaml
RESULTS ?= results

.PHONY: demo test install models clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(if $(TORCH_SPEC),$(PIP) install -q -c constraints.txt "$(TORCH_SPEC)")
	$(PIP) install -q -c constraints.txt -e .
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[test]"
	touch $@

install: $(STAMP)

# FP8 variants of the shipped bf16 models, rebuilt deterministically and checked
# against models/MANIFEST.json.
models: $(STAMP)
	$(BIN)/python models/recipes/build_variants.py

demo: models
	$(BIN)/quantgate run $(DEMO_CONFIG) --output-dir $(RESULTS)/demo

test: $(TEST_STAMP) models
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(RESULTS) models/*-fp8-*/
