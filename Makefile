# Two commands on a fresh machine: `make build` (set up + build the examples into out/), `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODELS := recipes/models/tiny_cnn.onnx recipes/models/llama_tiny.onnx recipes/models/llama_lora.onnx

.PHONY: setup models build test test-full unit wheel-check bench clean

setup: $(STAMP)

# constraints.txt pins the whole resolved set: a fresh machine gets the same toolchain (docs/deploy.md).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -c constraints.txt pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

models: $(MODELS)

$(MODELS) &: recipes/models/make_models.py recipes/models/llm_decoder.py $(STAMP)
	$(BIN)/python recipes/models/make_models.py

# `+` hands make's jobserver to ctxbuild, so under `make -jN` ninja takes its slots from make; under `make -n`
# ctxbuild then only lists what it would do.
build: $(STAMP) $(MODELS)
	+$(BIN)/ctxbuild build recipes -o out

# The suites run their files on TEST_WORKERS pytest workers (pytest-xdist; 0: one process). A serial run keeps
# about 1.2 of 2 cores busy (most tests wait on one QNN compile or simulator child), so two workers on 2 cores
# shorten it; a file's tests stay on one worker (--dist loadfile) and share its module fixtures.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile

# The core suite, under 10 minutes on 2 cores: unit tests and the main end-to-end paths. `make test-full` runs
# the long end-to-end files (farm, faults, caches, big models, bundles, LoRA, old toolchains); CI runs both, then
# the real public models (.ci/run). pytest's exit 5 (nothing collected) fails either target.
test: $(STAMP) $(MODELS)
	$(PYTEST) -m "not full" tests

test-full: $(STAMP) $(MODELS)
	$(PYTEST) -m full tests

# The unit tests only (planner, action key, golden build.ninja, cache stores, CLI): about 100 s
# (102 s on a clean clone at 563f969), no QNN run.
unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not e2e" tests

# The wheel, installed into a fresh virtualenv, builds the examples from another directory (.ci/run runs it).
wheel-check: $(STAMP)
	PYTHON=$(BIN)/python .ci/wheel-check

bench: $(STAMP) $(MODELS)
	$(BIN)/python bench/run.py

clean:
	rm -rf out
