"""Platform settings, from `TRAINYARD_*` environment variables (pydantic-settings).

Defaults describe the embedded default of DESIGN §3: everything under `.trainyard/` in the
working directory — SQLite state, a local-folder object store, a local MLflow store — so a
fresh clone runs with no configuration at all. The databases' defaults follow the home
(`trainyard.config.databases`): its embedded PostgreSQL once the stack has created one, else SQLite files.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard.config.databases import default_url

CONFIG_DIR = Path(__file__).parent
PACKAGE_ROOT = CONFIG_DIR.parent
"""Where the product's folders lie (`config/`, `worker/train.py`, …): the checkout, or the
installed `trainyard` package — the same relative paths under both."""


DEFAULT_DATA_CACHE_BYTES = 8 << 30
"""The shard cache's bound, on this machine and in a pod (`KubernetesOptions.data_cache_bytes`)."""
DATA_CACHE_ENV = "TRAINYARD_DATA_CACHE_DIR"
"""`Settings.data_cache_dir`'s variable: what every launcher gives its ranks, so their cache is
the node's (`KubernetesOptions.data_cache_dir` in a pod; the launcher's own on this machine)."""


def home_data_cache(home: Path) -> Path:
    """The node's shard cache under a home: `Settings.data_cache_dir`'s default, and the local
    launcher's when it is given none."""
    return home / "data-cache"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.cwd() / ".trainyard")
    """Where the embedded default keeps its state, objects, runs and logs."""
    object_store: str = ""
    """Root URI of the object store (`file:///…` or `s3://bucket/prefix`). Default: `<home>/objects`."""
    s3_endpoint_url: str | None = None
    """For MinIO and other S3-compatible stores (and, with per-run credentials, their IAM and STS)."""
    storage_credentials: Literal["per-run", "shared"] = "per-run"
    """On an S3 store, `per-run`: each run's ranks get temporary credentials that read only its
    dataset and resume point and write only its own checkpoints (a role per run, assumed at each
    launch: `trainyard.plugins.storage.credentials`); `shared`: they inherit the deployment's (a
    store without AWS's IAM and STS APIs, e.g. MinIO). A `file://` store has no credentials."""
    state_db: str = ""
    """SQLAlchemy URL of the platform state (allocations, job lifecycle). Default: the database
    `trainyard` of the home's embedded PostgreSQL once `make up` has created it, else SQLite
    `<home>/state.db` (`trainyard.config.databases`)."""
    mlflow_tracking_uri: str = ""
    """Default: the database `mlflow` of the home's embedded PostgreSQL once it exists, else a
    SQLite store `<home>/mlflow.db`; artifacts under `<home>/mlartifacts`."""
    cluster: str = "local"
    """Cluster name under `config/clusters/` or a path to a cluster file."""
    jobs_dir: Path = CONFIG_DIR / "jobs"
    """The TrainingJob specs Airflow renders as DAGs (`trainyard.dags`) and `trainyard submit` writes
    to; every Airflow component and the CLI must agree on it. Default: the package's example jobs."""
    demo_dags: bool = False
    """Also build the demo's data-publishing DAG (`trainyard_prepare_demo_data`); the embedded
    stack sets it, a deployment leaves it off."""
    teams_file: Path = CONFIG_DIR / "teams.yaml"
    node_agents: dict[str, str] = Field(default_factory=dict)
    """Node name → its node agent's base URL (JSON: `{"local-0": "http://127.0.0.1:9420"}`). The
    health watch of a job's DAG polls the agents of the job's nodes; a node without one is not
    watched (and the watch says so)."""
    kubernetes_conn_id: str = "kubernetes_default"
    """Airflow connection of the Kubernetes cluster (cncf-kubernetes provider's `KubernetesHook`);
    without Airflow, the kubeconfig is used."""
    airflow_url: str = "http://127.0.0.1:8080"
    """Airflow's API server, for `trainyard submit` (the embedded stack of `make up` / `make demo`
    listens here)."""
    airflow_token: SecretStr | None = None
    """Bearer token for Airflow's REST API; the embedded stack needs none (local-only auth)."""
    mlflow_ui_url: str = "http://127.0.0.1:5000"
    """Where people open the MLflow UI (the embedded stack's `mlflow server`)."""
    data_cache_dir: Path | None = None
    """The node's shard cache for streamed datasets (`trainyard.plugins.data.cache`), shared by the ranks
    of a node. Default: `<home>/data-cache` (set once the settings are made: never None then)."""
    data_cache_bytes: int = Field(default=DEFAULT_DATA_CACHE_BYTES, gt=0)
    """Size limit of the shard cache (least-recently-used shards are evicted above it)."""
    launchers: dict[str, str] = Field(default_factory=dict)
    """Extra launcher backends, cluster mode → `module:Class` (JSON); `local` and `kubernetes`
    are built in (`plugins.attempt.launchers`)."""
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    """Share of device memory a plan may use (the rest is left for fragmentation and spikes)."""

    @model_validator(mode="after")
    def _derive_defaults(self) -> Settings:
        home = self.home.resolve()
        object.__setattr__(self, "home", home)
        if not self.object_store:
            object.__setattr__(self, "object_store", (home / "objects").as_uri())
        if not self.state_db:
            object.__setattr__(self, "state_db", default_url(home, "state"))
        if not self.mlflow_tracking_uri:
            object.__setattr__(self, "mlflow_tracking_uri", default_url(home, "mlflow"))
        if self.data_cache_dir is None:
            object.__setattr__(self, "data_cache_dir", home_data_cache(home))
        return self

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests construct `Settings(...)` directly instead."""
    return Settings()
