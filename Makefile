# Two commands set everything up on a fresh machine: `make test` and `make demo`.
# Both create .venv (Python 3.11) when missing and install the pinned lock (constraints.txt).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trainyard-installed

.PHONY: venv test test-fast lint demo up down airflow lock clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# The product end to end: the embedded stack (Airflow, MLflow UI, node agents) comes up in the
# background and stays up for browsing (STOP=1 stops it at the end; `make down` later).
demo: $(STAMP)
	$(PY) -m cli.demo

# The embedded stack alone: Airflow on :8080 (no login), MLflow UI on :5000, node agents.
up: $(STAMP)
	$(PY) -m cli.stack up

airflow: up

down: $(STAMP)
	$(PY) -m cli.stack down

# Refresh the lock from the working venv after changing pyproject.toml's dependencies.
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(trainyard|pip|setuptools)==' > constraints.txt

clean:
	rm -rf $(VENV) .trainyard .pytest_cache .ruff_cache
