"""`python -m trainyard.cli.airflow_preloaded scheduler …`: Airflow's own command line, started after
importing what the tasks of a job's DAG import.

Why: the LocalExecutor forks its workers from the scheduler when it starts, and each task from
a worker (`supervise` forks; Celery's prefork pool does the same from `celery worker`). A module
the parent imported before that is already in every task's `sys.modules`; a module it did not is
imported again by every task. On this project's DAGs the imports were most of a task's time:
`great_expectations` ~7.5 s (`validate_data`), `mlflow` ~4 s (`launch_training`,
`classify_outcome`, `register_model`, …), torch ~3.3 s and DCP ~4 s more (`register_model`'s
export) — measured on a 2-core machine with `python -c "import time; t = time.time(); import M; …"`.
`import mlflow` leaves out its database stores, which every task that opens a client on the
embedded PostgreSQL (or any database URI) imported itself: a forked task's first
`client_for(uri)` and search took 0.58 CPU-s without them, 0.13 with them (getrusage, three
forks each).
Paid once here, they cost the scheduler ~20 s of start-up and ~600 MB resident (`ru_maxrss`
after these imports), which its forked workers share copy-on-write.

Fork safety: nothing here runs a computation or opens a connection, and the imports start no
Python thread (`threading.enumerate()` after them: the main thread only). They do start native
threads (3 more OS threads: BLAS pools and pyarrow's jemalloc background thread); a fork copies
only the forking thread, and forking after `import torch`/numpy is what every DataLoader worker
does.

The DAG processor forks too: one process per parse of a DAG file, every 30 s per file and on each
`trainyard submit`. It starts with what the DAG files import (`PARSE_PRELOAD`: the DAG factory,
its operators and sensors, the spec's models and rules — no torch, MLflow or Great Expectations),
so a parse reads the specs and builds the DAGs instead of importing them first. The API server and
the triggerer fork nothing and start bare.

What a preloaded process imported it keeps: after a change to those modules (not to the specs or
the DAG files, which every parse reads again) restart the stack, as for any Airflow deployment.
"""

from __future__ import annotations

import sys

from trainyard.plugins.preload import preload as preload_modules

PARSE_PRELOAD = (
    "trainyard.dags.training_jobs",
    "trainyard.dags.maintenance",
    "trainyard.dags.datasets",
    "trainyard.dags.factory",
    "trainyard.config.loader",
    "trainyard.config.rules",
    "trainyard.config.cluster",
    "trainyard.config.settings",
    "trainyard.operators.retrain",
    "trainyard.operators.datasets",
    "trainyard.operators.maintenance",
    "trainyard.plugins.data.assets",
)
"""What the DAG file (`trainyard.dags.dags`) imports: the DAG processor's parses start with it."""

PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "great_expectations",
    "trainyard.plugins.attempt.steps",
    "trainyard.plugins.attempt.closing",
    "trainyard.plugins.tracking.registry",
    "trainyard.plugins.tracking.runs",
    "trainyard.plugins.validation.data_quality",
    # what every task imports before its operator runs: Airflow's supervisor (in the executor's
    # worker) and task runner, and the DAG file's imports (with the settings it reads the jobs
    # folder from: a `Settings` class with attribute docstrings, whose source pydantic reads)
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    *PARSE_PRELOAD,
    # the launch's and the closing's own: the local launcher, the checkpoint catalog, the loss plot
    "trainyard.plugins.launch.local",
    "trainyard.plugins.checkpoint",
    "mlflow.pyfunc",
    "matplotlib.pyplot",
)
"""The imports of the job DAG's tasks, in the order their dependencies suggest. What a task still
imported after the first eleven, by `py-spy record --subprocesses` of the scheduler through one
training run: 57 % of its task processes' CPU (0.33 s a task; the settings' class alone 0.13 s)."""


def modules_for(command: str) -> tuple[str, ...]:
    """The preload of an Airflow subcommand: the DAG processor's parses need the DAG files'
    imports; the scheduler's (and Celery's) tasks need the tasks' heavy ones."""
    return PARSE_PRELOAD if command == "dag-processor" else PRELOAD


def preload(modules: tuple[str, ...]) -> dict[str, float]:
    """Import `modules`; returns module → seconds. A module that fails to import is reported
    and skipped: the task that needs it will raise the same error where a person looks."""
    return preload_modules(modules, who="trainyard preload")


def warm_api_client() -> None:
    """Make the Execution API client's TLS context once, before the forks. Each task's supervisor
    builds one when it opens its client (loading the system's CA bundle, 0.11 CPU-s by py-spy),
    even for an `http://` API server; Airflow caches it per process (`lru_cache` on a private
    static method), so a context made here is every forked supervisor's. Where that method is
    gone (another Airflow) nothing is warmed and each task makes its own again."""
    try:
        from airflow.sdk.api.client import API_SSL_CA_FILE_PATH, API_SSL_CERT_PATH, Client

        Client._get_ssl_context_cached(API_SSL_CA_FILE_PATH, API_SSL_CERT_PATH)
    except (ImportError, AttributeError, OSError) as e:
        print(f"trainyard preload: the API client's TLS context is not warmed ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)


def warm_mlflow_requirements() -> None:
    """Map the installed distributions to their modules once, before the forks. Every model a
    task registers is saved with its pip requirements, and MLflow checks them against this
    environment (`warn_dependency_requirement_mismatches`), first building that map from every
    installed distribution's metadata (`importlib.metadata.packages_distributions`: 0.27 CPU-s
    here, 282 distributions); MLflow keeps it per process, so a map made here is every forked
    task's. A package installed after the scheduler started is missing from it until a restart:
    the check warns about it, nothing else reads the map. Where the helper is gone (another
    MLflow) nothing is warmed."""
    try:
        from mlflow.utils.requirements_utils import _init_modules_to_packages_map

        _init_modules_to_packages_map()
    except (ImportError, AttributeError) as e:
        print(f"trainyard preload: MLflow's requirement map is not warmed ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    took = preload(modules_for(command))
    if command != "dag-processor":
        warm_api_client()
        warm_mlflow_requirements()
    print(f"trainyard preload: {sum(took.values()):.1f} s {took}", file=sys.stderr, flush=True)
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", *sys.argv[1:]]
    airflow_main()


if __name__ == "__main__":
    main()
