"""NCCL (and CUDA) variables suggested for a plan on a GPU cluster.

Only settings whose effect is documented and safe are suggested; NCCL's own tuner picks
algorithms and protocols better than a static rule, so NCCL_ALGO and NCCL_PROTO are left alone.
Nothing is suggested for CPU (gloo) runs.

- CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism: Megatron requires it so a TP
  collective is scheduled before the GEMM that depends on it (sequence-parallel overlap).
- TORCH_NCCL_AVOID_RECORD_STREAMS=1 with FSDP2: frees all-gather buffers deterministically
  (torchtitan sets it).
- NCCL_IB_DISABLE=0 / NCCL_NET_GDR_LEVEL=PHB for multi-node jobs: InfiniBand with GPUDirect
  RDMA between GPU and the HCA on the same PCIe switch (seed §8).
- NCCL_P2P_NET_CHUNKSIZE=524288 when pipeline stages talk across nodes: larger chunks for the
  point-to-point activation sends (Megatron's recommendation for PP over InfiniBand).
- NCCL_NVLS_ENABLE=1 on NVSwitch systems with TP > 1 (H100/H200): NVLink SHARP all-reduce.
- NCCL_DEBUG=WARN always: failures name their cause in the logs.
"""

from __future__ import annotations

from trainyard.plugins.advisor.hardware import Hardware
from trainyard.plugins.advisor.layout import Layout


def nccl_env(layout: Layout, hw: Hardware) -> dict[str, str]:
    if hw.gpu.is_cpu:
        return {}
    env = {"NCCL_DEBUG": "WARN"}
    multi_node = layout.degrees.world_size > hw.gpus_per_node
    if layout.degrees.tp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        if hw.gpu.name in ("H100", "H200"):
            env["NCCL_NVLS_ENABLE"] = "1"
    if layout.zero_stage >= 1:
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    if multi_node:
        env["NCCL_IB_DISABLE"] = "0"
        env["NCCL_NET_GDR_LEVEL"] = "PHB"
    if layout.degrees.pp > 1 and multi_node:
        env["NCCL_P2P_NET_CHUNKSIZE"] = "524288"
    return dict(sorted(env.items()))
