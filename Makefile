# Bootstrap .venv from nothing, then run the main job or the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# On a machine without CUDA, torch==2.13.0 resolves to the CPU wheel; on a GPU
# machine the same pin takes the CUDA build.
TORCH_PIN := torch==2.13.0
TORCH_SPEC ?= $(TORCH_PIN)
# Where nvidia-smi runs, .venv also gets the extra "gpu" (pyproject.toml), what the GPU configs
# need: the cuDNN frontend for ResNet's cudnn-fusion optimisation and torchvision 0.28.0, the build for
# torch 2.13.0, for ResNet's nvjpeg optimisation (nvJPEG). A TORCH_SPEC other than TORCH_PIN
# gets the extra "cudnn" only: torchvision==0.28.0 would replace that torch with 2.13.0.
# CPU machines get no torchvision: its wheels cannot import next to the CPU torch wheel.
CONFIG ?= cpu_tiny

.PHONY: venv mxnet-venv turbojpeg run test test-dali lint clean compliance-ci

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	extras=test; if command -v nvidia-smi > /dev/null; then extras=test,gpu; \
	  if [ "$(TORCH_SPEC)" != "$(TORCH_PIN)" ]; then extras=test,cudnn; \
	    echo "make venv: TORCH_SPEC=$(TORCH_SPEC) is not $(TORCH_PIN): no torchvision installed; install the build for that torch by hand (the nvjpeg optimisation needs it)"; \
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

# libturbojpeg 3 (ResNet's region-decode optimisation, benchmarks/resnet/region_decode.py), built from the
# libjpeg-turbo sources in simplejpeg's sdist (no wheel exposes the TurboJPEG 3 API) into $(VENV)/lib.
# pip finds the sdist by name and version on the configured package index; `pip download` itself
# cannot finish (simplejpeg's setup.py fetches libjpeg-turbo from elsewhere to write its metadata),
# so the address pip found is read from its log, and the file is fetched and its sha256 checked.
# With nasm (apt-get install nasm) it has libjpeg-turbo's SIMD code: its region decode took
# 0.69 ms an image against 1.03 ms in plain C (docs/performance.md). Without nasm it builds in
# plain C and says so, fine for the tests; where nvidia-smi runs (a machine that trains) that is
# an error naming the fix, as a GPU's loader processes would be 1.5x slower.
TURBOJPEG_SDIST := simplejpeg==1.9.0
TURBOJPEG_SHA256 := 5ac7d9489eeb812c2e7ea5c283994a29d9fefdfe5ed7b86c09d485e0dd366689
TURBOJPEG := $(VENV)/lib/libturbojpeg.so.0
turbojpeg: $(TURBOJPEG)

$(TURBOJPEG): $(VENV)/.installed
	@if ! command -v nasm >/dev/null; then \
	  if command -v nvidia-smi >/dev/null; then \
	    echo "error: nasm not found: libturbojpeg would build without SIMD (1.5x slower decodes on this GPU machine); apt-get install nasm, then make turbojpeg" >&2; exit 1; \
	  fi; \
	  echo "WARNING: nasm not found: libturbojpeg without SIMD, about 1.5x slower decodes; apt-get install nasm, then rm $@ && make turbojpeg" >&2; \
	fi
	rm -rf $(VENV)/build-turbojpeg && mkdir -p $(VENV)/build-turbojpeg
	cd $(VENV)/build-turbojpeg && url=$$($(abspath $(PY)) -m pip download --no-cache-dir --no-deps \
	    --no-binary simplejpeg -d dl -vvv $(TURBOJPEG_SDIST) 2>&1 \
	    | sed -n 's/^ *Found link \([^ ]*\/simplejpeg-1\.9\.0\.tar\.gz\)[ #].*/\1/p' | head -1) \
	  && { [ -n "$$url" ] || { echo "error: pip found no sdist of $(TURBOJPEG_SDIST) on its package index" >&2; exit 1; }; } \
	  && curl -fsSL -o sdist.tar.gz "$$url" \
	  && echo "$(TURBOJPEG_SHA256)  sdist.tar.gz" | sha256sum -c --quiet \
	  && tar xzf sdist.tar.gz --strip-components=3 simplejpeg-1.9.0/lib/libjpeg-turbo-3.1.2 \
	  && { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DENABLE_STATIC=0 > build.log 2>&1 \
	       && cmake --build build --target turbojpeg -j 2 >> build.log 2>&1 \
	       || { tail -20 build.log; exit 1; }; }
	cp -L $(VENV)/build-turbojpeg/build/libturbojpeg.so.0 $@
	rm -rf $(VENV)/build-turbojpeg

run: venv turbojpeg
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH CONFIG=$(CONFIG) bash benchmarks/resnet/run_and_time.sh

test: venv turbojpeg
	$(PY) -m pytest -q

# The DALI reader (the dali optimisation) in DALI's CPU mode against the Pillow reader; not part
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
