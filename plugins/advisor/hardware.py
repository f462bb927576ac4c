"""The hardware catalog, and the `Hardware` one plan is evaluated on.

Each `GpuSpec` holds what a data sheet says (peak dense FLOP/s, HBM size and bandwidth, link
bandwidths) plus the efficiencies this advisor assumes (what fraction of a peak real kernels
reach). A cluster inventory (`config/clusters/*.yaml`) overrides any of the data-sheet values;
`hardware_for(cluster, gpu_type)` merges the two and adds the topology (GPUs per node, nodes
per rack, the spine's oversubscription).

Units: bytes, FLOP/s, bytes/s, seconds. Link bandwidths are per GPU and per direction.

Sources: NVIDIA A100 / H100 / H200 data sheets (dense bf16 peaks 312 / 989 / 989 TFLOP/s,
HBM 2.0 / 3.35 / 4.8 TB/s, NVLink 600 / 900 / 900 GB/s bidirectional); DGX A100 has one
200 Gb/s HDR HCA per GPU, DGX H100/H200 one 400 Gb/s NDR HCA per GPU; SM counts 108 / 132 /
132. Ring-hop latencies are NCCL's own tuning constants (`src/graph/tuning.cc`, Simple
protocol: 3.4 µs per NVLink hop, 14 µs per network hop). The `cpu` entry was
measured on this project's CI machine (one torch thread per slot: ~95 GFLOP/s fp32 matmul,
gloo over loopback ~1.5 GB/s bus bandwidth with ~1 ms per small collective).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster

GiB = 1024**3
GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type: data-sheet figures and the efficiencies we assume for it."""

    name: str
    memory_bytes: int
    """Device memory (HBM) as the driver reports it."""
    peak_flops: float
    """Peak dense bf16/fp16 FLOP/s (tensor cores): the MFU denominator."""
    peak_flops_fp32: float
    """Peak for fp32 training: TF32 tensor cores on GPUs (torch `allow_tf32`), plain fp32 on CPU."""
    memory_bandwidth: float
    """HBM bandwidth, bytes/s: bounds the elementwise ops and the optimizer step."""
    intra_node_bandwidth: float
    """NVLink/NVSwitch, per GPU per direction, bytes/s."""
    inter_node_bandwidth: float
    """InfiniBand/RoCE per GPU (one HCA per GPU), bytes/s, inside a rack's leaf switch."""
    gpus_per_node: int = 8
    nodes_per_rack: int = 8
    sm_count: int | None = None
    """Streaming multiprocessors (A100 108, H100/H200 SXM 132: data sheets): a GEMM runs in
    waves of one output tile per SM, so small GEMMs leave SMs idle (`timing.wave_efficiency`).
    None (CPU): no such quantisation."""
    gemm_efficiency: float = 0.75
    """Fraction of `peak_flops` large matmuls reach (cuBLAS on big bf16 GEMMs); smaller ones
    reach this times their wave efficiency (`timing.wave_efficiency`) and their inner-dimension
    efficiency (`gemm_k_overhead`)."""
    gemm_k_overhead: float = 0.0
    """A GEMM's fixed cost per output tile (filling the tile's software pipeline, the epilogue
    that writes C), in elements of the inner dimension K: a GEMM of inner dimension K runs at
    K / (K + `gemm_k_overhead`) of `gemm_efficiency`. It is why small hidden sizes (and the h/tp
    or 4h/tp inner dimensions of a TP-split layer) reach a lower fraction of peak than large
    ones at the same output size — see `GEMM_K_OVERHEAD` for the sources and the fit."""
    attention_efficiency: float = 0.5
    """Fraction of peak the fused (flash) attention kernels reach, forward and backward."""
    link_efficiency: float = 0.8
    """Fraction of a link's bandwidth NCCL's collectives reach (bus bandwidth)."""
    intra_node_latency_s: float = 3.4e-6
    """One NVLink hop of a ring (NCCL's `hwLat[NVLINK][RING][SIMPLE]`, `src/graph/tuning.cc`)."""
    inter_node_latency_s: float = 14e-6
    """One network hop of a ring (NCCL's `hwLat[NET][RING][SIMPLE]`); a spine hop counts 1.5×."""
    layer_overhead_s: float = 30e-6
    """Fixed cost per layer and micro-batch (kernel launches, dispatch), forward + backward:
    what makes many tiny micro-batches slower than a few big ones at equal FLOPs."""
    framework_bytes: int = 2 * GiB
    """Fixed per-device overhead: CUDA context, cuBLAS workspace, NCCL buffers."""
    comm_overlap: float = 0.9
    """Largest share of data-parallel communication that hides behind compute (NCCL runs on
    its own streams and SMs; gloo on CPU shares the cores with compute, so nothing hides)."""

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    def peak_flops_at(self, precision: str) -> float:
        """The MFU denominator at a training precision: `peak_flops_fp32` for fp32 training,
        the dense bf16/fp16 peak otherwise."""
        return float(self.peak_flops_fp32 if precision == "fp32" else self.peak_flops)


def with_peak(gpu: GpuSpec, peak_flops: float) -> GpuSpec:
    """`gpu` with another dense bf16 peak (a cluster's `peakTflops`); fp32 scales with it."""
    return replace(gpu, peak_flops=peak_flops,
                   peak_flops_fp32=gpu.peak_flops_fp32 * peak_flops / gpu.peak_flops)


GEMM_K_OVERHEAD = 384.0
"""`GpuSpec.gemm_k_overhead` of the NVIDIA GPUs, in K elements.

The curve's shape: NVIDIA's "Matrix Multiplication Background User's Guide" (Deep Learning
Performance documentation: arithmetic intensity grows with K at fixed M, N; each output tile
pays a fixed prologue and epilogue beside its K/k_tile main-loop steps) and the measured GEMM
throughput against hidden size of Anthony et al., "The Case for Co-Designing Model
Architectures with Hardware" (arXiv 2401.14489, 2024: §IV–V, throughput rises with the hidden
size and levels off past a few thousand on A100 and H100). The form K / (K + k0) is ours.

The value and the A100's `gemm_efficiency` are fitted together, on a grid (efficiency 0.01,
k0 64), to the in-sample rows only — [N21] Table 1, ten Megatron-LM runs on A100 with hidden
sizes 2,304 … 25,600 (`published.fit_gemm_curve`, which a test re-runs) — minimising the
squared log error of tokens/s; the held-out rows ([K22], [L3], [TT], [B22]) are reported
apart. Before it (k0 = 0, A100 0.70): Table 1 +14 … −5 %, GPT 22B +12 %, Llama 3.1 8B +40 %,
+44 %. Hopper's value is the Ampere fit (no in-sample Hopper rows); its `gemm_efficiency`
is left as it was."""

CATALOG: dict[str, GpuSpec] = {
    "A100_80GB": GpuSpec(
        name="A100_80GB", memory_bytes=80 * GiB, peak_flops=312e12, peak_flops_fp32=156e12,
        memory_bandwidth=2039 * GB, intra_node_bandwidth=300 * GB, inter_node_bandwidth=25 * GB,
        gemm_efficiency=0.73, gemm_k_overhead=GEMM_K_OVERHEAD, attention_efficiency=0.5, sm_count=108),
    "H100": GpuSpec(
        name="H100", memory_bytes=80 * GiB, peak_flops=989e12, peak_flops_fp32=494.5e12,
        memory_bandwidth=3350 * GB, intra_node_bandwidth=450 * GB, inter_node_bandwidth=50 * GB,
        gemm_efficiency=0.62, gemm_k_overhead=GEMM_K_OVERHEAD, attention_efficiency=0.45, sm_count=132),
    "H200": GpuSpec(
        name="H200", memory_bytes=140 * GiB, peak_flops=989e12, peak_flops_fp32=494.5e12,
        memory_bandwidth=4800 * GB, intra_node_bandwidth=450 * GB, inter_node_bandwidth=50 * GB,
        gemm_efficiency=0.64, gemm_k_overhead=GEMM_K_OVERHEAD, attention_efficiency=0.47, sm_count=132),
    "cpu": GpuSpec(
        name="cpu", memory_bytes=4 * GiB, peak_flops=0.1e12, peak_flops_fp32=0.1e12,
        memory_bandwidth=10 * GB, intra_node_bandwidth=1.5 * GB, inter_node_bandwidth=1.5 * GB,
        gpus_per_node=2, nodes_per_rack=2, gemm_efficiency=0.6, attention_efficiency=0.3,
        link_efficiency=1.0, intra_node_latency_s=5e-4, inter_node_latency_s=5e-4,
        layer_overhead_s=3e-4, framework_bytes=384 * 1024**2, comm_overlap=0.0),
}
"""Built-in accelerator types. `H100` is the 80 GB SXM part."""

ALIASES: dict[str, str] = {"A100": "A100_80GB", "H100_SXM": "H100", "H100_80GB": "H100", "CPU": "cpu"}


def gpu_spec(name: str) -> GpuSpec:
    """The catalog entry for `name` (a few common spellings accepted)."""
    key = ALIASES.get(name, name)
    if key not in CATALOG:
        raise ValueError(f"unknown accelerator type {name!r}; the catalog has "
                         f"{', '.join(sorted(CATALOG))} (set its figures in the cluster's "
                         "`accelerators` section to plan for another type)")
    return CATALOG[key]


@dataclass(frozen=True)
class Hardware:
    """The devices of one job: an accelerator type plus the topology it sits in."""

    gpu: GpuSpec
    gpus_per_node: int
    nodes_per_rack: int
    cross_rack_oversubscription: float = 1.0
    total_gpus: int | None = None
    """Devices of this type in the cluster (None: unknown, e.g. a what-if plan)."""

    @property
    def memory_bytes(self) -> int:
        return self.gpu.memory_bytes

    @property
    def gpus_per_rack(self) -> int:
        return self.gpus_per_node * self.nodes_per_rack

    @property
    def intra_node_bandwidth(self) -> float:
        return self.gpu.intra_node_bandwidth * self.gpu.link_efficiency

    @property
    def intra_rack_bandwidth(self) -> float:
        return self.gpu.inter_node_bandwidth * self.gpu.link_efficiency

    @property
    def cross_rack_bandwidth(self) -> float:
        return self.intra_rack_bandwidth / self.cross_rack_oversubscription

    def describe(self) -> str:
        return (f"{self.gpu.name} ({self.gpu.memory_bytes / GiB:.0f} GiB, "
                f"{self.gpu.peak_flops / 1e12:g} TFLOP/s), {self.gpus_per_node} per node")

    def with_gpu(self, gpu: GpuSpec) -> Hardware:
        """The same topology with another accelerator (for 'a bigger GPU would fit')."""
        return replace(self, gpu=replace(gpu, gpus_per_node=self.gpus_per_node))


def hardware_from_spec(gpu: GpuSpec, *, gpus_per_node: int | None = None,
                       nodes_per_rack: int | None = None, oversubscription: float = 1.0,
                       total_gpus: int | None = None) -> Hardware:
    """A `Hardware` for a catalog entry without a cluster (what-if plans, published runs)."""
    return Hardware(gpu=gpu, gpus_per_node=gpus_per_node or gpu.gpus_per_node,
                    nodes_per_rack=nodes_per_rack or gpu.nodes_per_rack,
                    cross_rack_oversubscription=oversubscription, total_gpus=total_gpus)


def hardware_for(cluster: Cluster, gpu_type: str) -> Hardware:
    """Merge the catalog entry for `gpu_type` with what `cluster` says about it.

    The cluster wins: its `accelerators.<type>` (memory, peak, HBM bandwidth) and `network`
    (NVLink and InfiniBand per GPU, spine oversubscription) override the catalog, and its
    racks give GPUs per node and nodes per rack. An accelerator unknown to the catalog plans
    when the cluster gives at least its memory and peak.
    """
    if gpu_type not in cluster.gpu_types():
        raise ValueError(f"cluster {cluster.name!r} has no {gpu_type!r} devices; it has "
                         f"{', '.join(sorted(cluster.gpu_types()))}")
    accel = cluster.accelerator(gpu_type)
    try:
        base = gpu_spec(gpu_type)
    except ValueError:
        if accel.memory is None or accel.peak_tflops is None:
            raise
        base = replace(CATALOG["H100"], name=gpu_type)
    if accel.peak_tflops is not None:
        base = with_peak(base, accel.peak_tflops * 1e12)
    net = cluster.spec.network
    gpu = replace(
        base,
        memory_bytes=int(accel.memory) if accel.memory is not None else base.memory_bytes,
        memory_bandwidth=accel.memory_bandwidth or base.memory_bandwidth,
        intra_node_bandwidth=net.intra_node_bandwidth or base.intra_node_bandwidth,
        inter_node_bandwidth=net.intra_rack_bandwidth or base.inter_node_bandwidth,
    )
    nodes = [n for n in cluster.nodes if n.gpu_type == gpu_type]
    per_rack: dict[str, int] = {}
    for n in nodes:
        per_rack[n.rack] = per_rack.get(n.rack, 0) + 1
    return Hardware(
        gpu=gpu,
        gpus_per_node=cluster.gpus_per_node(gpu_type),
        nodes_per_rack=max(per_rack.values()),
        cross_rack_oversubscription=net.cross_rack_oversubscription,
        total_gpus=cluster.total_gpus(gpu_type, healthy_only=True),
    )
