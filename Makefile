# Two commands set everything up on a fresh machine: `make test` and `make demo`.
# Both create .venv (Python 3.11) when missing and install the pinned lock (constraints.txt).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trainyard-installed

.PHONY: venv services test test-fast lint layout kube-components demo up down airflow lock clean

venv: $(STAMP)

# uv installs the lock (~270 wheels) in parallel: seconds where pip took minutes. The first install
# on a machine downloads ~4.5 GB into uv's cache (PyPI's torch 2.13.0 is the CUDA build: torch and
# its NVIDIA libraries are ~4 GB; 56 s here), later ones link from the cache.
# `.[all,test]`: every extra (the control plane, Great Expectations) and the test tools.
# --compile-bytecode: pip compiles the installed modules, uv does not. Without the .pyc files every
# Python process compiles what it imports, and where PYTHONDONTWRITEBYTECODE is set (this machine's
# shell, most images) never stops doing so: `import trainyard.worker.train` took 12.3 CPU-s instead of 4.6,
# and the suite starts hundreds of fresh processes (rank starters, torchrun, Airflow's parts, pods).
# The install takes ~40 s longer, once.
UV_VERSION := 0.13.9

$(STAMP): pyproject.toml setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -c constraints.txt -e '.[all,test]'
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Real Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
# etcd, Kueue) built once with this machine's Go into ~/.cache/trainyard/kube/<versions>/bin and
# reused after (tests/support/kube/components.py says which versions and why Kueue, not Volcano).
kube-components: $(STAMP)
	$(PY) -m tests.support.kube.components

# README.md's layout section, made from each package's docstring (tests/unit/test_layout.py holds it).
layout: $(STAMP)
	$(PY) -m tests.support.layout --write

# The suite on two pytest-xdist workers (tests/conftest.py says what stays together): the shared
# end-to-end stack's tests on one, the tests with stacks of their own and then the rest of the
# suite on the other. A third worker overloads 2 cores (measured: the e2e tests slow down more
# than the others gain, and timing-sensitive integration tests flake). PYTEST_WORKERS=0 runs it
# in this process.
# The checkout's own modules compiled first (~1 CPU-s; hidden folders skipped, .venv is compiled
# already): where PYTHONDONTWRITEBYTECODE is set, each fresh process (a rank starter, torchrun, a
# node agent) would compile them again.
PYTEST_WORKERS ?= 2
test: $(STAMP) lint services kube-components
	@$(PY) -m compileall -q -x '/\.' . > /dev/null
	$(PY) -m pytest -n $(PYTEST_WORKERS)

# What the suite needs beside Python, from Debian, started on loopback (tests/services.sh says which).
services:
	@bash tests/services.sh

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# The product end to end: the embedded stack (Airflow, MLflow UI, node agents) comes up in the
# background and stays up for browsing (STOP=1 stops it at the end; `make down` later).
demo: $(STAMP)
	$(PY) -m trainyard.cli.demo

# The embedded stack alone: Airflow on :8080 (no login), MLflow UI on :5000, node agents.
up: $(STAMP)
	$(PY) -m trainyard.cli.stack up

airflow: up

down: $(STAMP)
	$(PY) -m trainyard.cli.stack down

# Refresh the lock from the working venv after changing pyproject.toml's dependencies.
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(trainyard|pip|setuptools|uv)==' > constraints.txt

clean:
	rm -rf $(VENV) .trainyard .pytest_cache .ruff_cache
