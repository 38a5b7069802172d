# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv, installs, runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
OUT    ?= out/demo

.PHONY: setup lock demo test test-slow test-runners test-airflow test-mutations fetch-runners clean

LOCK   := requirements.lock
DEMO_STAMP := $(VENV)/.installed-demo-stamp
# pip prints one line per package (no --quiet) so a first run shows its progress; every install
# is constrained by the lock (make lock).
PIP_FLAGS  := --progress-bar off --disable-pip-version-check

$(DEMO_STAMP): setup.py $(LOCK)
	@echo ">> creating $(VENV) and installing the package (first run: a few minutes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_FLAGS) --upgrade pip
	$(BIN)/pip install $(PIP_FLAGS) --constraint $(LOCK) -e .
	touch $(DEMO_STAMP)

$(STAMP): setup.py $(LOCK) $(DEMO_STAMP)
	@echo ">> installing the test and plot extras"
	$(BIN)/pip install $(PIP_FLAGS) --constraint $(LOCK) -e ".[test,plot]"
	touch $(STAMP)

setup: $(STAMP)

## Regenerate the pinned dependency lock from setup.py (used by `make setup` and the Dockerfile):
## every extra the container or CI installs, for CPython 3.11 on Linux x86-64 (the worker image).
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[lock]"
	$(BIN)/uv pip compile setup.py --quiet --extra gcp --extra dask --extra test --extra plot \
	    --python-version 3.11 --python-platform x86_64-manylinux_2_31 \
	    --custom-compile-command "make lock" --output-file $(LOCK)

## Run the main job (CentralNotice release) on the bundled sample data with the DirectRunner.
## Installs only the package itself (no test extras).
demo: $(DEMO_STAMP)
	rm -rf $(OUT)
	$(BIN)/python -m pipelines.centralnotice --demo --output $(OUT)

## Run the default test suite (well under 15 minutes on 2 cores).
test: setup
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not runners" tests

## Heavier suites: large statistical runs, and other Beam runners (fetches job-server jars).
test-slow: setup
	$(BIN)/python -m pytest -q -n 2 -m "slow" tests

## The mutation suite: each named broken variant of the real code (tests/mutations/mutants.py)
## applied to a scratch copy of the tree, two at a time; each must be caught by the privacy
## tests. Prints per mutant the test that caught it; fails if one survives or no longer applies.
test-mutations: setup
	$(BIN)/python tests/mutations/run.py

## Prism is built from the Go module proxy (~6 min cold, cached). Flink and Spark job-server jars
## are fetched when the Maven mirror serves them (this machine's does not: their tests then skip).
fetch-runners: setup
	$(BIN)/python -m runners.fetch prism
	$(BIN)/python -m runners.fetch flink spark --best_effort

test-runners: fetch-runners
	BEAM_DP_REQUIRE_RUNNERS=prism $(BIN)/python -m pytest -q -m "runners" tests

## The example Airflow DAG builds (Airflow and its Beam provider in a virtualenv of their own:
## ~175 packages, several minutes).
AIRFLOW_VENV := .venv-airflow
test-airflow:
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install --quiet -e ".[airflow]" pytest
	BEAM_DP_REQUIRE_AIRFLOW=1 $(AIRFLOW_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "" tests/test_runners.py -k airflow

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) out build *.egg-info
