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

# These paths go into recipes unquoted, and `clean` removes two of them: whitespace would split
# one path into several (VENV="my venv" made my/ and venv/; `clean` would remove `my` and
# `results`), so a path that is not one word is refused before anything runs.
$(foreach name,VENV RESULTS DEMO_CONFIG,$(if $(filter 1,$(words $($(name)))),,$(error \
  $(name)='$($(name))' must be one path, not empty and with no whitespace (make uses it \
  unquoted and `make clean` removes VENV and RESULTS); choose a path without spaces)))

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.quantgate-installed
TEST_STAMP := $(VENV)/.quantgate-test-installed

# The settings a venv is made with, written into it once it is complete (pip upgraded). A venv
# keeps them: recreating it is the only way to drop system site-packages or a torch it installed,
# so a make asking for other settings is refused instead of silently using the old venv (the
# GPU set-up after a `make demo` kept the CPU torch and no system site-packages).
VENV_SETTINGS := $(strip PYTHON=$(PYTHON) VENV_FLAGS=$(VENV_FLAGS) TORCH_SPEC=$(TORCH_SPEC))
VENV_STAMP := $(VENV)/.quantgate-venv
VENV_MADE := $(strip $(shell cat '$(VENV_STAMP)' 2>/dev/null))
# Present while the venv is being made. `python -m venv` interrupted (Ctrl-C while it installs
# pip) leaves a python without pip, which every later make would use and fail on ("No module
# named pip"); a folder with this marker and no VENV_STAMP is remade from scratch instead.
VENV_PARTIAL := $(VENV)/.quantgate-venv-partial

.PHONY: demo test install models clean venv-settings

VENV_SETTINGS_DIFFER = $(VENV) was made with $(VENV_MADE) but this make asks for $(VENV_SETTINGS), \
  which only a new venv gets: run `make clean` (it removes $(VENV), $(RESULTS) and the built FP8 models) \
  and make again, or make with the settings it was made with (export them for every make)

# Run whenever the venv is needed: was the venv there made with this make's settings?
venv-settings:
	@:$(if $(VENV_MADE),$(if $(subst $(VENV_SETTINGS),,$(VENV_MADE))$(subst $(VENV_MADE),,$(VENV_SETTINGS)),\
	  $(error $(VENV_SETTINGS_DIFFER))))

# A folder without VENV_STAMP is remade when this Makefile started it (VENV_PARTIAL: an
# interrupted make) or finished it before VENV_STAMP existed (STAMP); any other folder there is
# someone else's, never removed.
$(VENV_STAMP): | venv-settings
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
	printf '%s\n' '$(subst ','\'',$(VENV_SETTINGS))' > $@.tmp
	mv $@.tmp $@
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
