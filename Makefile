# Two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# One stamp per install, each made once and again when pyproject.toml changes: the package
# with its base dependencies (all `make demo` needs: the gate, the reference relay and the
# CLI; neither the inbox nor the MCP extra), and the same plus pyproject's [test] extra, which
# brings both extras and the test tools (`make test`; it satisfies the first stamp too).
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test

.PHONY: demo test test-fast lint venv clean axe

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# A regular install, not an editable one: the demo only runs the package, and setuptools'
# editable-install notice (its meta path finder for this flat layout) is never printed.
# build/ goes first: setuptools reuses it, and would ship a module deleted since.
$(RUNTIME): pyproject.toml | $(BIN)/python
	rm -rf build
	$(BIN)/pip install --quiet .
	touch $@

# Editable for development: the tests that start the installed `hitl-gate` (Node-RED, n8n)
# then run the working tree, whatever changed since.
$(TESTING): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(RUNTIME)

venv: $(RUNTIME)

demo: $(RUNTIME)
	$(BIN)/python scripts/demo.py

# Everything, on WORKERS pytest-xdist processes (--dist loadfile: a module stays on one
# worker, so its module-scoped daemon is started once); WORKERS=0: one process. Three on a
# 2-core machine: the tests spend much of their time waiting on daemons, browsers and
# deadlines (two workers kept the machine about 55 % busy).
WORKERS ?= 3
test: $(TESTING) axe
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

# axe-core (the exact version in tests/a11y/package-lock.json) checks the inbox's pages in the
# browser tests; installed from the npm registry when npm is here and the lock file changed,
# never fetched while the tests run (without npm those tests skip, and fail under HITL_CI=1).
AXE_LOCK := tests/a11y/package-lock.json
AXE_STAMP := tests/a11y/node_modules/.package-lock.json
axe:
	@if [ -f $(AXE_LOCK) ] && command -v npm >/dev/null 2>&1 \
		&& ! [ $(AXE_STAMP) -nt $(AXE_LOCK) ]; then \
		npm ci --prefix tests/a11y --no-audit --no-fund --silent; fi

# The fast tier: no daemon, no other process, no real timeout (markers in tests/conftest.py).
test-fast: $(TESTING)
	$(BIN)/python -m pytest -m "not e2e and not slow and not toolchain"

# The habits CI enforces (.ci/run runs this before `make test`).
lint: $(TESTING)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) var build dist *.egg-info
