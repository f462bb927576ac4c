"""The cluster inventory: racks, nodes, accelerators, network and health history.

A 10,000-GPU fleet must be a few lines of YAML, so racks and nodes are written as templates
(`name: "rack-{index:03d}"`, `count: 130`) that expand to concrete `Node`s; per-node health
(unhealthy, recent Xid errors, warm dataset caches) is a sparse override map on top.
In Kubernetes mode the same `Cluster` is built from node labels (`plugins/placement`).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from trainyard.config.problems import preview
from trainyard.config.quantities import Bandwidth, Bytes
from trainyard.plugins.errors import FatalError

CLUSTERS_DIR = Path(__file__).parent / "clusters"


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
    )


class Accelerator(_Section):
    """What the cluster says about one accelerator type; unset values come from the
    advisor's built-in catalog (`plugins/advisor/hardware.py`)."""

    memory: Bytes | None = None
    """Device memory (HBM), e.g. `80GiB`."""
    peak_tflops: PositiveFloat | None = None
    """Peak dense bf16 TFLOP/s per device."""
    memory_bandwidth: Bandwidth | None = None
    """HBM bandwidth with its unit (`3.35TB/s`), bytes/s once read."""
    hourly_rate_usd: PositiveFloat | None = None
    """Cost of one device-hour, for chargeback."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        return refuse_renamed(data, "accelerators.<type>", {"memoryBandwidthGbps": "memoryBandwidth"})


class Network(_Section):
    """Bandwidths per GPU, unidirectional, each written with its unit (`450GB/s`, `400Gb/s`)
    and held in bytes/s. Unset values come from the advisor's catalog for the node's GPU type."""

    intra_node_bandwidth: Bandwidth | None = None
    """NVLink (NVSwitch) bandwidth per GPU (`450GB/s` for NVLink 4)."""
    intra_rack_bandwidth: Bandwidth | None = None
    """InfiniBand / RoCE per GPU between nodes of one rack (leaf switch, full bisection):
    `400Gb/s` for one NDR port per GPU (= 50 GB/s)."""
    cross_rack_oversubscription: PositiveFloat = 1.0
    """Spine oversubscription: cross-rack bandwidth = intra-rack / this."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        return refuse_renamed(data, "network", {"intraNodeGbps": "intraNodeBandwidth",
                                                "intraRackGbps": "intraRackBandwidth"})


def refuse_renamed(data: object, where: str, renamed: dict[str, str]) -> object:
    """Refuse the old `…Gbps` fields, which held gigaBYTES per second (`Gbps` means gigabits
    to every network engineer), naming the field, its value and the new spelling."""
    if isinstance(data, dict):
        for old, new in renamed.items():
            if old in data:
                value = data[old]
                raise ValueError(
                    f"{where}.{old} ({value!r}) is no longer read: it held GB/s under a name that says "
                    f"gigabits. Write `{new}: {value}GB/s` if {value} was gigabytes per second "
                    f"(as this field meant), or `{new}: {value}Gb/s` for gigabits")
    return data


def check_name_template(template: str, fields: frozenset[str]) -> str:
    """A name pattern may use only its own placeholders, plainly (`{index:03d}`): no attribute
    or item access (`{rack.__class__}`), no huge widths, no unknown names (a KeyError later)."""
    import string

    if len(template) > 200:
        raise ValueError(f"name pattern of {len(template)} characters; at most 200")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"name pattern {preview(template, 80)!r}: {e}") from e
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in fields or conversion or not _SAFE_SPEC.fullmatch(spec or ""):
            raise ValueError(f"name pattern {preview(template, 80)!r}: placeholder "
                             f"{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                             f"is not allowed; use {', '.join('{' + f + '}' for f in sorted(fields))} "
                             "with an optional width like :03d")
    return template


_SAFE_SPEC = re.compile(r"0?[1-9]?d?")


class NodeTemplate(_Section):
    name: str = "{rack}-n{index}"
    """Node name pattern; `{rack}` is the rack's name, `{index}` counts from `start`."""

    @field_validator("name")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return check_name_template(value, frozenset({"rack", "index"}))

    count: PositiveInt = 1
    start: NonNegativeInt = 0
    gpu_type: str
    gpus_per_node: PositiveInt
    address: str | None = None
    """Host address; the local cluster uses 127.0.0.1 for every node."""


class RackTemplate(_Section):
    name: str = "rack-{index}"

    @field_validator("name")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return check_name_template(value, frozenset({"index"}))

    count: PositiveInt = 1
    start: NonNegativeInt = 0
    nodes: list[NodeTemplate] = Field(min_length=1)


class NodeHistory(_Section):
    """Sparse per-node overrides: what the fleet's history says about one node."""

    healthy: bool = True
    xid_errors_7d: NonNegativeInt = Field(default=0, alias="xidErrors7d")
    """Xid errors seen on the node's GPUs in the last 7 days."""
    cached_datasets: list[str] = Field(default_factory=list)
    """Datasets warm in the node's local cache (URIs)."""


class Node(BaseModel):
    """A concrete node after template expansion."""

    model_config = ConfigDict(frozen=True)

    name: str
    rack: str
    gpu_type: str
    gpus: int
    address: str
    healthy: bool = True
    xid_errors_7d: int = 0
    cached_datasets: tuple[str, ...] = ()


class ClusterSpec(_Section):
    mode: str = Field(default="kubernetes", pattern=r"^[a-z][a-z0-9-]{0,31}$")
    """How jobs are launched here: `local` (torchrun agents on this host) or `kubernetes` (a
    Volcano Job on a managed fleet) — or a mode a site wired itself (`TRAINYARD_LAUNCHERS`).
    A mode no launcher is wired for is refused when a job is validated for this cluster."""
    launcher: dict[str, Any] = Field(default_factory=dict)
    """Options of the mode's launcher (for `kubernetes`: `KubernetesOptions` — namespace,
    images, scheduler…); the launcher validates them."""
    accelerators: dict[str, Accelerator] = Field(default_factory=dict)
    network: Network = Field(default_factory=Network)
    racks: list[RackTemplate] = Field(min_length=1)
    health: dict[str, NodeHistory] = Field(default_factory=dict)


class ClusterMetadata(_Section):
    name: str


class Cluster(_Section):
    api_version: Literal["training.platform/v1"] = "training.platform/v1"
    kind: Literal["Cluster"] = "Cluster"
    metadata: ClusterMetadata
    spec: ClusterSpec

    @model_validator(mode="after")
    def _names_unique(self) -> Cluster:
        total = sum(r.count * sum(n.count for n in r.nodes) for r in self.spec.racks)
        if total > MAX_NODES:
            raise ValueError(f"the rack templates expand to {total:,} nodes; at most {MAX_NODES:,}")
        names = [n.name for n in self.nodes]
        if len(names) != len(set(names)):
            seen: set[str] = set()
            dup = next(n for n in names if n in seen or seen.add(n))  # type: ignore[func-returns-value]
            raise ValueError(f"node name {dup!r} is generated twice; give the templates distinct names or starts")
        unknown = set(self.spec.health) - set(names)
        if unknown:
            raise ValueError(f"health entries name unknown nodes: {sorted(unknown)[:5]}")
        return self

    @property
    def name(self) -> str:
        return self.metadata.name

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        """Every node, in rack order then node order."""
        out: list[Node] = []
        for rack_t in self.spec.racks:
            for r in range(rack_t.start, rack_t.start + rack_t.count):
                rack = rack_t.name.format(index=r)
                for node_t in rack_t.nodes:
                    for i in range(node_t.start, node_t.start + node_t.count):
                        name = node_t.name.format(rack=rack, index=i)
                        h = self.spec.health.get(name, NodeHistory())
                        out.append(Node(
                            name=name, rack=rack, gpu_type=node_t.gpu_type, gpus=node_t.gpus_per_node,
                            address=node_t.address or name, healthy=h.healthy,
                            xid_errors_7d=h.xid_errors_7d, cached_datasets=tuple(h.cached_datasets),
                        ))
        return tuple(out)

    @cached_property
    def racks(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for node in self.nodes:
            out.setdefault(node.rack, []).append(node)
        return out

    def gpu_types(self) -> set[str]:
        return {n.gpu_type for n in self.nodes}

    def gpus_per_node(self, gpu_type: str) -> int:
        """Largest node size for a GPU type (TP must fit inside one node)."""
        return max((n.gpus for n in self.nodes if n.gpu_type == gpu_type), default=0)

    def total_gpus(self, gpu_type: str, *, healthy_only: bool = False) -> int:
        return sum(n.gpus for n in self.nodes
                   if n.gpu_type == gpu_type and (n.healthy or not healthy_only))

    def accelerator(self, gpu_type: str) -> Accelerator:
        return self.spec.accelerators.get(gpu_type, Accelerator())


def known_clusters() -> list[str]:
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))


def cluster_for(gpu_type: str, preferred: str | Path) -> Cluster:
    """The preferred cluster if it has `gpu_type`, else the first known cluster that does
    (so `trainyard plan llama-7b.yaml` on a laptop plans for the H100 fleet, not the CPU box).
    Falls back to the preferred one, whose rules then report the unknown type."""
    first = load_cluster(preferred)
    if gpu_type in first.gpu_types():
        return first
    for name in known_clusters():
        candidate = load_cluster(name)
        if gpu_type in candidate.gpu_types():
            return candidate
    return first


MAX_CLUSTER_BYTES = 1_000_000
"""A cluster file is templates, not a node list: a 10k-GPU fleet is a few dozen lines."""
MAX_NODES = 200_000
"""Nodes after template expansion (10x the largest fleets); checked before expanding."""


class ClusterFileError(FatalError, ValueError):
    """A cluster file that cannot be used: a folder, unreadable, binary, not YAML, over the
    limits, or not a Cluster. One line, naming the file; callers exit with a usage error."""


def load_cluster(name_or_path: str | Path) -> Cluster:
    """Load `config/clusters/<name>.yaml`, or a cluster file given by path. Raises
    `FileNotFoundError` for a name or path that does not exist and `ClusterFileError` for a
    file that is not a valid cluster — each a one-line message, never a parser traceback."""
    path = Path(name_or_path)
    if not path.suffix and "/" not in str(name_or_path):  # a name; anything with a '/' is a path
        path = CLUSTERS_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise FileNotFoundError(
            f"no cluster {preview(str(name_or_path), 200)!r}; known clusters: {', '.join(known_clusters())}")
    return parse_cluster(_read_cluster_bytes(path), where=str(path))


def _read_cluster_bytes(path: Path) -> bytes:
    import stat

    where = preview(str(path), 200)
    if path.is_dir():
        raise ClusterFileError(f"cluster file {where} is a folder; give a cluster YAML file or a name "
                               f"({', '.join(known_clusters())})")
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device never ends
            raise ClusterFileError(f"cluster file {where} is not a regular file")
        size = st.st_size
        if size > MAX_CLUSTER_BYTES:
            raise ClusterFileError(f"cluster file {where} is {size / 1e6:.1f} MB; a cluster file is at "
                                   f"most {MAX_CLUSTER_BYTES // 1_000_000} MB of templates")
        with path.open("rb") as f:
            return f.read(MAX_CLUSTER_BYTES + 1)
    except OSError as e:
        raise ClusterFileError(f"cannot read cluster file {where}: {e.strerror or e}") from e


def parse_cluster(raw: bytes, *, where: str = "<cluster>") -> Cluster:
    """Parse and validate a cluster document; every failure is one `ClusterFileError` line."""
    from pydantic import ValidationError

    from trainyard.config.safe_yaml import YamlLimitError, load_documents

    where = preview(where, 200)
    if len(raw) > MAX_CLUSTER_BYTES:
        raise ClusterFileError(f"cluster file {where} is over {MAX_CLUSTER_BYTES // 1_000_000} MB")
    if b"\x00" in raw:
        raise ClusterFileError(f"cluster file {where} is binary (it contains NUL bytes), not YAML")
    try:
        documents = [d for d in load_documents(raw.decode("utf-8")) if d is not None]
    except UnicodeDecodeError as e:
        raise ClusterFileError(f"cluster file {where} is not UTF-8 text (bad byte at offset {e.start})") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        detail = getattr(e, "problem", None) or str(e)
        raise ClusterFileError(f"cluster file {where}{line} is not valid YAML: "
                               f"{preview(str(detail), 200)}") from e
    except (YamlLimitError, ValueError, TypeError, OverflowError, RecursionError) as e:
        raise ClusterFileError(f"cluster file {where} refused: {preview(str(e), 200)}") from e
    if len(documents) != 1 or not isinstance(documents[0], dict):
        found = f"{len(documents)} documents" if len(documents) != 1 else f"a {type(documents[0]).__name__}"
        raise ClusterFileError(f"cluster file {where} is not a Cluster: it holds {found}, not one "
                               "mapping with 'kind: Cluster'")
    try:
        return Cluster.model_validate(documents[0])
    except ValidationError as e:
        first = e.errors(include_url=False)
        shown = "; ".join(f"{'.'.join(map(str, err['loc'])) or '<root>'}: "
                          f"{err['msg'].removeprefix('Value error, ')}" for err in first[:3])
        more = f" (+{len(first) - 3} more)" if len(first) > 3 else ""
        raise ClusterFileError(f"cluster file {where} is not a valid Cluster: "
                               f"{preview(shown, 400)}{more}") from e
