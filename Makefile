# Bootstrap .venv from nothing, then run the main job or the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# On a machine without CUDA, torch==2.13.0 resolves to the CPU wheel; on a GPU
# machine the same pin takes the CUDA build.
TORCH_PIN := torch==2.13.0
TORCH_SPEC ?= $(TORCH_PIN)
# Where nvidia-smi runs, .venv also gets the extra "gpu" (pyproject.toml), what the GPU configs
# need: the cuDNN frontend for ResNet's --cudnn-fusion and torchvision 0.28.0, the build for
# torch 2.13.0, for ResNet's --data-backend gpu (nvJPEG). A TORCH_SPEC other than TORCH_PIN
# gets the extra "cudnn" only: torchvision==0.28.0 would replace that torch with 2.13.0.
# CPU machines get no torchvision: its wheels cannot import next to the CPU torch wheel.
CONFIG ?= cpu_tiny

.PHONY: venv mxnet-venv run test test-dali lint clean compliance-ci

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	extras=test; if command -v nvidia-smi > /dev/null; then extras=test,gpu; \
	  if [ "$(TORCH_SPEC)" != "$(TORCH_PIN)" ]; then extras=test,cudnn; \
	    echo "make venv: TORCH_SPEC=$(TORCH_SPEC) is not $(TORCH_PIN): no torchvision installed; install the build for that torch by hand (--data-backend gpu needs it)"; \
	  fi; \
	fi; \
	$(PY) -m pip install -q -e ".[$$extras]"
	touch $@

# MXNet in its own venv (mxnet 1.9.1 needs numpy<1.24, which .venv cannot take): the second
# framework of `python -m common.bench resnet --baseline mxnet` (CPU only, see README).
MXNET_VENV := .venv-mxnet
mxnet-venv: $(MXNET_VENV)/.installed

$(MXNET_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(MXNET_VENV)
	$(MXNET_VENV)/bin/python -m pip install -q "mxnet==1.9.1" "numpy<1.24"
	touch $@

run: venv
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH CONFIG=$(CONFIG) bash benchmarks/resnet/run_and_time.sh

test: venv
	$(PY) -m pytest -q

# The DALI reader (--data-backend dali) in DALI's CPU mode against the Pillow reader; not part
# of `make test`: it installs nvidia-dali-cuda120 (the extra "dali", about 790 MB) into .venv.
# REQUIRE_DALI=1 turns the tests' skip without DALI into a failure.
test-dali: $(VENV)/.dali-installed
	REQUIRE_DALI=1 $(PY) -m pytest -q -m dali tests/benchmarks/resnet/test_dali.py

$(VENV)/.dali-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dali]"
	touch $@

# Compliance over the logs the end-to-end tests kept (E2E_LOGDIR, see tests/compliance/e2e_logs.py):
# every log through the MLCommons checker, every full set of runs packaged and checked.
E2E_LOGDIR ?= results/e2e
compliance-ci: venv
	@ls $(E2E_LOGDIR)/*/result_*.txt > /dev/null 2>&1 || { echo "no end-to-end logs under $(E2E_LOGDIR)"; exit 1; }
	$(PY) -m compliance.check $(E2E_LOGDIR)/*/result_*.txt
	@for d in $(E2E_LOGDIR)/*-nexp*; do [ -d "$$d" ] || continue; \
	  b=$$(basename "$$d"); b=$${b%%-nexp*}; \
	  $(PY) -m compliance.package --submitter ci --system ci_cpu --benchmark "$$b" \
	    --system-desc .ci/system_fields.json "$$d" "$(E2E_LOGDIR)/package-$$b" || exit 1; \
	done

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) $(MXNET_VENV) results .fixtures
