"""A real embedded Airflow (api-server, scheduler, dag-processor, triggerer on the home's
embedded PostgreSQL, with the LocalExecutor) over a Trainyard home in a temporary folder, for
the end-to-end tests.

The same `trainyard.cli.stack.Stack` that `make up` starts; only the demo spec is in its jobs folder at
first (fewer DAGs to parse; its model smaller, `SMALLER_MODEL`) — a test adds its own with
`add_jobs` — and the demo dataset is written before the first DAG run. The tests under
`shared_stack/` share one for the session's part they run in (`shared_stack/conftest.py`); the
production path and the demo start their own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.support import procs
from tests.support.environ import environment
from tests.support.waiting import wait_for
from trainyard.cli.stack import Stack
from trainyard.config.settings import Settings, get_settings
from trainyard.plugins.airflow_api import AirflowClient, AttemptRun, follow_training_run

DEMO = procs.REPO_ROOT / "config" / "jobs" / "demo-tiny-lm.yaml"
DAG_ID = "demo-tiny-lm"
SMALLER_MODEL = {"hiddenSize": 64, "numLayers": 2, "ffnHiddenSize": 176}
"""The demo's model at a sixth of its parameters, for the e2e specs (`demo_spec`): these tests'
subject is the platform around the model, and a step of the demo's model costs its two ranks
0.31 CPU-s, of this one 0.05 (`trainyard launch --local --offline` of 10 and 70 steps of each,
process accounting). The demo test (`make demo`), the recovery tests' OOM spec (its re-plan needs
the size: at this one nothing smaller fits the 4 CPU slots after an OOM), the retraining and the
launch-failure specs keep the demo's model."""
T = TypeVar("T")


def demo_spec(name: str = DAG_ID, *, smaller: bool = True) -> dict[str, Any]:
    """The demo job's spec (a TrainingJob document) named `name`, training `SMALLER_MODEL`
    unless `smaller` is False."""
    spec = yaml.safe_load(DEMO.read_text())
    spec["metadata"]["name"] = name
    if smaller:
        spec["spec"]["parallelism"]["hints"].update(SMALLER_MODEL)
    return spec


@dataclass
class RunningStack:
    stack: Stack
    settings: Settings
    client: AirflowClient

    def train(self, conf: dict[str, object], *, timeout_s: float = 600) -> list[AttemptRun]:
        """Trigger the demo DAG and follow the training run through all its attempts."""
        first = self.client.trigger(DAG_ID, conf)["dag_run_id"]
        return follow_training_run(self.client, DAG_ID, first, timeout_s=timeout_s)

    @property
    def jobs_dir(self) -> Path:
        return Path(os.environ["TRAINYARD_JOBS_DIR"])

    def write_jobs(self, specs: dict[str, dict[str, object]]) -> None:
        """Write job specs (name → TrainingJob document) into the stack's jobs folder."""
        for name, spec in specs.items():
            (self.jobs_dir / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    def add_jobs(self, specs: dict[str, dict[str, object]], *, timeout_s: float = 120) -> None:
        """`write_jobs`, then wait until Airflow lists their DAGs (asking for the parse, as
        `trainyard submit` does)."""
        self.write_jobs(specs)
        if not set(specs) <= set(self.client.dags()):
            assert self.client.request_parse(), "no DAG of the jobs' DAG file to ask a parse with"
        deadline = time.monotonic() + timeout_s
        while not set(specs) <= set(self.client.dags()):
            assert time.monotonic() < deadline, f"DAGs {sorted(set(specs) - set(self.client.dags()))} never " \
                                                f"appeared\n{self.logs()}"
            time.sleep(1)

    def until(self, what: str, check: Callable[[], T], *, timeout_s: float, poll_s: float = 1.0) -> T:
        """`check()`'s first truthy value; fails naming `what`, with the stack's logs, after `timeout_s`."""
        try:
            return wait_for(check, what, timeout_s, poll_s=poll_s)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def wait_for_task(self, dag_id: str, run_id: str, task: str, state: str, *, timeout_s: float = 240) -> None:
        self.until(f"{task} of {run_id} to be {state}",
                   lambda: self.client.task_instances(dag_id, run_id).get(task, {}).get("state") == state,
                   timeout_s=timeout_s, poll_s=0.5)

    def logs(self) -> str:
        parts = []
        for component in ("scheduler", "triggerer", "dag-processor"):
            path = self.stack.log_file(component)
            if path.exists():
                parts.append(f"==> {component} <==\n" + path.read_text(errors="replace")[-4000:])
        # the task logs that hold an error: a failed task's reason is there, not in the components'
        task_logs = sorted((self.stack.home / "airflow" / "logs").glob("dag_id=*/run_id=*/task_id=*/attempt=*.log"))
        for path in task_logs:
            text = path.read_text(errors="replace")
            if "Traceback" in text or '"level":"error"' in text or "[error" in text:
                parts.append(f"==> {path.relative_to(self.stack.home)} <==\n{text[-3000:]}")
        return "\n".join(parts)


@contextmanager
def running_stack(home: Path, *, overrides: dict[str, str] | None = None,
                  agents: dict[str, str] | None = None, mlflow_port: int = 0,
                  mlflow_hosts: tuple[str, ...] = ()) -> Iterator[RunningStack]:
    """The stack over `home`; `overrides` (also set in this process, for its own checks) switch
    it to the production path: metadata, state and MLflow on PostgreSQL, the CeleryExecutor.
    `agents` (node → URL) are the node agents the health watches poll. `mlflow_port`: the
    stack's MLflow server listens there (`Stack.mlflow_port`; an override
    `TRAINYARD_MLFLOW_TRACKING_URI=http://127.0.0.1:<port>` makes every client use it), also
    answering to `mlflow_hosts`."""
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    jobs = home / "jobs"
    jobs.mkdir(parents=True)
    # the demo job as the platform runs any job: with the fast path on (the demo spec turns it off
    # to show the control plane's hand-over in the UI)
    spec = demo_spec()
    spec["spec"]["faultTolerance"]["inPlaceRestarts"] = 1
    (jobs / DEMO.name).write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {"TRAINYARD_HOME": str(home), "TRAINYARD_JOBS_DIR": str(jobs), "OMP_NUM_THREADS": "1",
           **({"TRAINYARD_NODE_AGENTS": json.dumps(agents)} if agents else {}), **(overrides or {})}
    try:
        with environment(env):
            from trainyard.plugins.storage.store import open_store

            settings = Settings()
            prepare_demo_dataset(open_store(settings.object_store, endpoint_url=settings.s3_endpoint_url
                                            ).child(DEMO_PREFIX.rstrip("/")))
            stack = Stack(home, port=procs.free_port(), overrides=dict(overrides or {}), durable_db=False,
                          mlflow_port=mlflow_port, mlflow_hosts=mlflow_hosts)
            try:
                stack.up(timeout_s=240)
                get_settings.cache_clear()  # this process's commands (`trainyard.cli.main`) read the stack's home
                # read once the stack is up: its databases (the home's embedded PostgreSQL) exist now
                yield RunningStack(stack, Settings(), AirflowClient(stack.url))
            finally:  # the rank templates stay: the other worker's attempts use them (the session's
                stack.down(templates=False)  # end stops them, `tests/conftest.py`)
    finally:
        get_settings.cache_clear()
