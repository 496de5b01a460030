# The two set-up commands of the README: `make demo` and `make test`. Both create .venv,
# install from this project's own files, then run. A GPU user keeps the CUDA torch installed
# in their Python with `make VENV_FLAGS=--system-site-packages TORCH_SPEC= demo` (torch is then
# only required as a range by pyproject.toml).

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_SPEC ?= torch==2.13.0
DEMO_CONFIG ?= eval_configs/tiny/demo.yaml
RESULTS ?= results

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.quantgate-installed
TEST_STAMP := $(VENV)/.quantgate-test-installed

# Written into the venv once it is complete (pip upgraded).
VENV_STAMP := $(VENV)/.quantgate-venv
# Present while the venv is being made. `python -m venv` interrupted (Ctrl-C while it installs
# pip) leaves a python without pip, which every later make would use and fail on ("No module
# named pip"); a folder with this marker and no VENV_STAMP is remade from scratch instead.
VENV_PARTIAL := $(VENV)/.quantgate-venv-partial

.PHONY: demo test install models clean

# A folder without VENV_STAMP is remade when this Makefile started it (VENV_PARTIAL: an
# interrupted make) or finished it before VENV_STAMP existed (STAMP); any other folder there is
# someone else's, never removed.
$(VENV_STAMP):
	@if [ -e $(VENV) ] && [ ! -e $(VENV_PARTIAL) ] && [ ! -e $(STAMP) ] && [ -n "$$(ls -A $(VENV))" ]; then \
	  echo "make: $(VENV) exists but is not a venv this Makefile finished (no $(VENV_STAMP)): remove it" \
	    "(\`make clean\` removes it, $(RESULTS) and the built FP8 models) and make again, or choose another VENV=" >&2; \
	  exit 1; \
	fi
	rm -rf $(VENV)
	mkdir -p $(VENV)
	touch $(VENV_PARTIAL)
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@
	rm -f $(VENV_PARTIAL)

$(STAMP): pyproject.toml constraints.txt $(VENV_STAMP)
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
