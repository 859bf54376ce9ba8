# The two commands a newcomer needs: `make run` and `make test`. Only Python 3.11+ and make required.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_RUN  := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
PYTEST_ARGS ?=

.PHONY: run test lint migrate bench lock clean help

help:
	@echo "make run    start the gateway on the embedded SQLite default (http://127.0.0.1:8000/docs)"
	@echo "make test   set up everything, run make lint, then the whole suite on SQLite and PostgreSQL"
	@echo "make lint   only the static checks: ruff check and mypy --strict over app/ and the client"

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): $(BIN)/python requirements.lock pyproject.toml
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

$(STAMP_TEST): $(STAMP_RUN) requirements-dev.lock clients/python/pyproject.toml
	$(BIN)/python -m pip install --quiet -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps -e clients/python
	touch $@

# Local development: loopback only, and without API keys unless GATEWAY_AUTH__MODE says otherwise.
run: $(STAMP_RUN)
	GATEWAY_AUTH__MODE=$${GATEWAY_AUTH__MODE:-disabled} $(BIN)/storage-gateway serve

migrate: $(STAMP_RUN)
	$(BIN)/storage-gateway migrate

# Static checks first: they take seconds, the suite takes minutes. Both read pyproject.toml.
lint: $(STAMP_TEST)
	$(BIN)/ruff check
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP_TEST)
	@for script in bench/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# Re-pin the dependencies (needs uv: pip install uv).
lock:
	uv pip compile pyproject.toml --python-version 3.11 --no-header -o requirements.lock
	uv pip compile pyproject.toml --extra test --python-version 3.11 --no-header -o requirements-dev.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
