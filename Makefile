# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv, installs, runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
OUT    ?= out/demo

.PHONY: setup lock demo smoke test test-slow test-runners test-airflow test-browser test-mutations fetch-runners bench-peers clean

LOCK   := requirements.lock
AIRFLOW_LOCK := requirements-airflow.lock
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

## Regenerate the pinned dependency locks from setup.py (used by `make setup`, the Dockerfile and
## `make test-airflow`): every extra the container or CI installs, for CPython 3.11 on Linux x86-64
## (the worker image). Airflow has a lock of its own: it pins many packages differently.
LOCK_FLAGS := --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_31 \
	--custom-compile-command "make lock"
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[lock]"
	$(BIN)/uv pip compile setup.py $(LOCK_FLAGS) --extra gcp --extra dask --extra test --extra plot \
	    --extra dataframes --extra browser --output-file $(LOCK)
	echo pytest | $(BIN)/uv pip compile setup.py - $(LOCK_FLAGS) --extra airflow \
	    --output-file $(AIRFLOW_LOCK)

## Run the main job (CentralNotice release) on the bundled sample data with the DirectRunner.
## Installs only the package itself (no test extras). The ledger and keys stay under $(OUT), so a
## second run reproduces the releases and spends nothing; `rm -rf $(OUT)` starts afresh.
demo: $(DEMO_STAMP)
	$(BIN)/python -m pipelines.centralnotice --demo --output $(OUT)
	$(BIN)/python -m pipelines.catalog --ledger $(OUT)/ledger.json --releases $(OUT)/releases --config pipelines/sample_data/centralnotice/campaigns.json --metadata pipelines/sample_data/centralnotice/datasets.json --output $(OUT)/catalog --operator $(OUT)/catalog-operator

## A first check of a fresh clone, under a minute once installed (29 s measured on 2 busy
## cores, most of it the demo's Beam pipeline): the demo's releases made afresh in a scratch
## folder, then their catalog built. Installs only the package itself, as `make demo` does.
SMOKE := out/smoke
smoke: $(DEMO_STAMP)
	rm -rf $(SMOKE)
	$(BIN)/python -m pipelines.centralnotice --demo --output $(SMOKE)
	$(BIN)/python -m pipelines.catalog --ledger $(SMOKE)/ledger.json --releases $(SMOKE)/releases --config pipelines/sample_data/centralnotice/campaigns.json --metadata pipelines/sample_data/centralnotice/datasets.json --output $(SMOKE)/catalog
	@echo ">> smoke: a release was made and its catalog built (open $(SMOKE)/catalog/index.html)"

## Run the default test suite (about 10 minutes on 2 quiet cores: benchmarks/RESULTS.md).
test: setup
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not runners and not browser" tests

## Heavier suites: large statistical runs (with Polars, for its DataFrame input tests), and other
## Beam runners (fetches job-server jars).
DATAFRAMES_STAMP := $(VENV)/.installed-dataframes-stamp
$(DATAFRAMES_STAMP): $(STAMP)
	$(BIN)/pip install $(PIP_FLAGS) --constraint $(LOCK) -e ".[test,plot,dataframes]"
	touch $(DATAFRAMES_STAMP)

test-slow: $(DATAFRAMES_STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "slow" tests

## The release catalog's pages in a real browser: Debian's chromium and chromedriver (installed
## with apt-get when missing) driven by selenium; screenshots at desktop and phone widths go to
## out/browser/.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-browser: setup
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo ">> installing Debian's chromium and chromium-driver"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver; }
	$(BIN)/pip install $(PIP_FLAGS) --constraint $(LOCK) -e ".[browser]"
	BEAM_DP_REQUIRE_BROWSER=1 BEAM_DP_BROWSER_OUT=out/browser $(BIN)/python -m pytest -q -m browser tests

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

## The example Airflow DAG builds (Airflow and its Beam provider in a virtualenv of their own,
## under their own lock: ~280 packages). uv installs them (pip took minutes, silent while it
## unpacked) and prints what it resolved, fetched and installed.
AIRFLOW_VENV := .venv-airflow
test-airflow:
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	@echo ">> installing Airflow under $(AIRFLOW_LOCK) into $(AIRFLOW_VENV) (first run: a minute or more)"
	$(AIRFLOW_VENV)/bin/pip install $(PIP_FLAGS) "uv>=0.5"
	$(AIRFLOW_VENV)/bin/uv pip install --python $(AIRFLOW_VENV)/bin/python \
	    --constraint $(AIRFLOW_LOCK) -e ".[airflow]" pytest
	BEAM_DP_REQUIRE_AIRFLOW=1 $(AIRFLOW_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "" tests/runners/test_runners.py -k airflow
	@# The Airflow lock holds an older dp-accounting (Airflow's attrs excludes the main lock's):
	@# the multi-key dominating PLD reads its mass functions, so its tests run on it too.
	$(AIRFLOW_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	    tests/accounting/verification/test_stated_guarantees.py -k "dominating_pld or mixed_release"

## Benchmark peers, each in a virtualenv of its own under benchmarks/.venvs/ (never dependencies
## of the project; their pins are in benchmarks/utility_peers/): PipelineDP on the same Beam as the
## lock (benchmarks/aggregate.py runs this target on first use) and OpenDP (benchmarks/utility.py).
PEERS_DIR := benchmarks/.venvs
BEAM_PIN  := $(shell sed -n 's/^apache-beam==//p' $(LOCK))
bench-peers: $(PEERS_DIR)/pipelinedp/.ready $(PEERS_DIR)/opendp/.ready
$(PEERS_DIR)/pipelinedp/.ready: benchmarks/utility_peers/requirements-pipelinedp.txt
	test -x $(PEERS_DIR)/pipelinedp/bin/python || $(PYTHON) -m venv $(PEERS_DIR)/pipelinedp
	$(PEERS_DIR)/pipelinedp/bin/pip install $(PIP_FLAGS) "apache-beam==$(BEAM_PIN)" pyarrow \
	    -r benchmarks/utility_peers/requirements-pipelinedp.txt
	touch $@
$(PEERS_DIR)/opendp/.ready: benchmarks/utility_peers/requirements-opendp.txt
	test -x $(PEERS_DIR)/opendp/bin/python || $(PYTHON) -m venv $(PEERS_DIR)/opendp
	$(PEERS_DIR)/opendp/bin/pip install $(PIP_FLAGS) -r benchmarks/utility_peers/requirements-opendp.txt
	touch $@

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) out build *.egg-info
