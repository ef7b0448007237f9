# Every target sets up its own virtual environment first (.venv), installing the CPU
# build of torch 2.13.0 before anything that depends on torch.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?= transformer
RUN_DIR ?= runs/demo

SUITE ?= runs/suite
TRIALS ?= 300

.PHONY: venv demo suite test test-slow bench lint calibrate fidelity fidelity-heldout search validate report clean help

help:
	@echo "make demo        the whole loop on the default workload (start here)"
	@echo "make test        the default test suite (no GPU, a few minutes on 2 cores)"
	@echo "make test-slow   the slow tests"
	@echo "make bench       benchmarks (executor overhead vs eager, simulator speed)"
	@echo "make calibrate   full calibration of this machine -> traces/profile.json"
	@echo "make fidelity    simulator vs executor on the built-in workloads and plans"
	@echo "make fidelity-heldout  the same on the held-out models calibration never sees"
	@echo "make suite       search (Optuna + both papers' strategies), validate and report every built-in workload"
	@echo "make lint        ruff and mypy"

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/schedlab demo --model $(MODEL) --run-dir $(RUN_DIR)

suite: $(STAMP)
	test -f traces/profile.json || $(BIN)/schedlab calibrate
	for m in mlp cnn transformer nmt; do \
	  $(BIN)/schedlab search $$m --trials $(TRIALS) --run-dir $(SUITE)/$$m && \
	  $(BIN)/schedlab search $$m --strategy paper-concurrency --run-dir $(SUITE)/$$m && \
	  $(BIN)/schedlab search $$m --strategy ooo --run-dir $(SUITE)/$$m && \
	  $(BIN)/schedlab validate $(SUITE)/$$m --top 3 || exit 1; \
	done
	$(BIN)/schedlab report $(SUITE)

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

bench: $(STAMP)
	$(BIN)/python -m pytest -m bench --benchmark-enable -p no:cacheprovider tests/bench

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m tests.tools.package_tree build/typecheck >/dev/null
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p schedlab

calibrate: $(STAMP)
	$(BIN)/schedlab calibrate

fidelity: $(STAMP)
	$(BIN)/schedlab fidelity

fidelity-heldout: $(STAMP)
	test -f traces/profile.json || $(BIN)/schedlab calibrate
	$(BIN)/schedlab fidelity --held-out

search: $(STAMP)
	$(BIN)/schedlab search $(MODEL) --run-dir $(RUN_DIR)

validate: $(STAMP)
	$(BIN)/schedlab validate $(RUN_DIR)

report: $(STAMP)
	$(BIN)/schedlab report $(RUN_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
