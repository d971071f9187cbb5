# tailscope: `make demo` runs the main job on the default store, `make test` runs every check.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STORE ?= $(HOME)/.local/share/tailscope/store

#: pytest workers (pytest-xdist): one per core and one more, which runs while the others' tests wait on their servers,
#: subprocesses and deliberate sleeps (CONTRIBUTING.md, "The slowest tests"); `make test WORKERS=1` runs the suite in
#: one process
WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
#: what makes a missing prerequisite (chromium, chdb, a C part where a compiler is) fail rather than skip
STRICT := TAILSCOPE_TEST_STRICT=1
#: the parallel run: a test file stays on one worker (its module fixtures are built once); files are handed out in
#: the order tests/conftest.py sorts them (the longest first, by tests/file_seconds.json), not by their number of tests
PYTEST_PAR = $(VENV)/bin/pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder
#: more arguments for the whole suite's run, e.g. `make test PYTEST_ARGS=--junitxml=/tmp/suite.xml` (the report
#: tests/file_seconds.py refreshes its table from)
PYTEST_ARGS ?=

.PHONY: all venv demo test test-fast lint typecheck unit browser-deps monitoring-deps system-deps ch-releases bench clean

all: test

# every extra plus the dev tools; pip builds the optional C decoder (intake/_otlpx.c) and replay
# kernel (analysis/_replay.c) when a C compiler is there, and otherwise notes it and goes on
# (tailscope then uses its Python code for both: the same results, slower). The installed packages are byte-compiled
# as pip would, but without the test suites some of them ship (`tests`/`test` folders: pandas', pyarrow's, numpy's,
# 1,900 files that nothing imports): compiling those was about 40 % of the compiling (7.5 of 17.5 CPU-seconds), and
# the install is the step everything else waits for. A module of those folders imported anyway is compiled then. As
# with pip's own compiling, a file that does not compile (a package's file for another Python) does not stop the
# install: `-`.
$(STAMP): pyproject.toml setup.py intake/_otlpx.c analysis/_replay.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -e '.[all,dev]'
	-$(PY) -m compileall -q -x 'site-packages/(.+/)?tests?/' $(VENV)/lib
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tailscope demo --store "$(STORE)"

# Debian's chromium for the browser test (Playwright drives it; no browser download).
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi; \
	fi

# Debian's Prometheus and Alertmanager for the /metrics and alert-routing tests (real servers on loopback).
monitoring-deps:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; fi; \
	fi

# the Debian packages the tests drive, one apt-get after the other (apt holds one lock)
system-deps:
	@$(MAKE) --no-print-directory browser-deps
	@$(MAKE) --no-print-directory monitoring-deps

# The older ClickHouse releases the tests serve over HTTP (tests/clickhouse_http.py), one venv each since one venv
# holds one chdb: release -> the chdb that embeds it (checked with SELECT version()). The newest is .venv's chdb.
# No chdb embeds 25.3 (3.3.0 embeds 24.8.4, 3.4.1 embeds 25.5.2): 25.5 stands between the two LTS releases.
CH_RELEASES := 24.8 25.5 25.8
CHDB_24.8 := 3.3.0
CHDB_25.5 := 3.4.1
CHDB_25.8 := 3.7.2
CH_STAMPS := $(foreach r,$(CH_RELEASES),.venv-ch/$(r)/.chdb-$(CHDB_$(r)))

# installed once per release and chdb version (the stamp names both). The venv is made without a pip of its own
# (ensurepip costs about 3 CPU-seconds a venv, and nothing runs pip there again): $(PYTHON)'s pip installs into it
# (`--python`, pip >= 22.3); where that pip cannot, ensurepip gives the venv its own. Nothing is byte-compiled at
# install (`--no-compile`): compiling the venv's 2,100 files (pandas, numpy, pyarrow come with chdb) costs about
# 7 CPU-seconds a venv, while the only program run there, the HTTP front, imports about 90 of them, compiled when
# first imported (about 0.2 CPU-seconds a start where bytecode is not written, as under PYTHONDONTWRITEBYTECODE).
define CH_VENV
.venv-ch/$(1)/.chdb-$(CHDB_$(1)):
	$(PYTHON) -m venv --without-pip .venv-ch/$(1)
	if $(PYTHON) -m pip --python .venv-ch/$(1)/bin/python --version >/dev/null 2>&1; then \
	  $(PYTHON) -m pip --python .venv-ch/$(1)/bin/python install --quiet --no-compile "chdb==$(CHDB_$(1))" lz4 zstandard; \
	else \
	  .venv-ch/$(1)/bin/python -m ensurepip --default-pip >/dev/null && \
	  .venv-ch/$(1)/bin/python -m pip install --quiet --no-compile "chdb==$(CHDB_$(1))" lz4 zstandard; \
	fi
	touch $$@
endef
$(foreach r,$(CH_RELEASES),$(eval $(call CH_VENV,$(r))))

ch-releases: $(CH_STAMPS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# the whole suite, in parallel workers, a missing prerequisite failing; the ten slowest tests printed at the end.
# Our modules are compiled once first: every process the tests start (a CLI, a receiver, a dashboard) then reads
# their bytecode, also where PYTHONDONTWRITEBYTECODE is set and each process would compile them again.
unit: $(STAMP) system-deps ch-releases
	$(PY) -m compileall -q tracing intake analysis dashboard tailscope sample_traces benchmarks examples tests
	$(STRICT) $(PYTEST_PAR) --durations=10 $(PYTEST_ARGS)

# what CI runs (.ci/run): install (the venv, the Debian packages and the older ClickHouse releases' venvs at once),
# then ruff and mypy beside the suite
test:
	@$(MAKE) --no-print-directory -j4 venv system-deps ch-releases
	@$(MAKE) --no-print-directory -j3 lint typecheck unit

# the edit-run loop: the suite without the tests marked `slow` (CONTRIBUTING.md); CI still runs everything
test-fast: $(STAMP)
	$(PYTEST_PAR) -m "not slow"

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .venv-ch build *.egg-info .pytest_cache .mypy_cache .ruff_cache
