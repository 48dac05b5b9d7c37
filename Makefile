# `make run` serves the app; `make test` runs the whole suite. Both set up everything they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp for what serving needs (`make run`), one for the test, lint and benchmark tools on top;
# each named after its requirements' content, so editing a pin installs again.
RUN_STAMP := $(VENV)/.installed-run-$(shell cat requirements.txt | sha1sum | cut -c1-12)
DEV_STAMP := $(VENV)/.installed-dev-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
SYSTEM_PACKAGES := redis-server=redis-server redis-cli=redis-tools nginx=nginx-light
TEST_PACKAGES := node=nodejs npm=npm chromium-headless-shell=chromium-headless-shell

.PHONY: run test lint bench deps dev-deps system-deps clean

$(RUN_STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	rm -f $(VENV)/.installed-run-* && touch $@

$(DEV_STAMP): $(RUN_STAMP) requirements-dev.txt
	$(BIN)/pip install -q -r requirements-dev.txt
	rm -f $(VENV)/.installed-dev-* && touch $@

deps: $(RUN_STAMP)

dev-deps: $(DEV_STAMP)

system-deps:
	scripts/ensure-packages.sh $(SYSTEM_PACKAGES)

run: deps system-deps
	scripts/run.sh

lint: dev-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The OpenID provider the OAuth tests run against (tests/oidc, pinned by its lock file).
OIDC_STAMP := tests/oidc/node_modules/.installed
$(OIDC_STAMP): tests/oidc/package.json tests/oidc/package-lock.json
	scripts/ensure-packages.sh $(TEST_PACKAGES)
	cd tests/oidc && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Three processes on two cores: the suite waits on servers, browsers and time-outs for a quarter of its time.
test: dev-deps system-deps lint $(OIDC_STAMP)
	scripts/ensure-packages.sh $(TEST_PACKAGES)
	$(BIN)/pytest --numprocesses 3 --dist loadfile --durations 15

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): requirements-bench.txt $(DEV_STAMP)
	$(BIN)/pip install -q -r requirements-bench.txt
	touch $@

# Not part of `make test`: benchmarks of the service beside flask-sse and nginx+nchan (bench/README.md).
bench: dev-deps system-deps $(BENCH_STAMP)
	scripts/ensure-packages.sh wrk=wrk
	test -f /usr/lib/nginx/modules/ngx_nchan_module.so || scripts/ensure-packages.sh nchan-module=libnginx-mod-nchan
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
