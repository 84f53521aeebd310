# Bootstrap .venv from nothing, then run the main job or the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# On a machine without CUDA, torch==2.13.0 resolves to the CPU wheel; on a GPU
# machine the same pin takes the CUDA build.
TORCH_SPEC ?= torch==2.13.0
CONFIG ?= cpu_tiny

.PHONY: venv run test lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

run: venv
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH CONFIG=$(CONFIG) bash benchmarks/resnet/run_and_time.sh

test: venv
	$(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) results .fixtures
