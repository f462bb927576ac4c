"""The in-training runtime: what a training script imports to be a good citizen of the platform.

- `worker.session.TrainingSession` — the callback (seed Appendix B): process group, restore,
  checkpoint cadence, heartbeats, divergence, SIGTERM, MLflow metrics.
- `worker.distributed.parallelize.parallelize(model, plan, mesh)` — apply an advisor `Plan`
  with torch's own DDP / FSDP2 / DTensor TP / pipelining / activation checkpointing.
- `worker.sampler.ResumableSampler` — deterministic data order that resumes at the exact next
  sample, on any world size.
- `worker.models.llama` — the example model; `worker/train.py` — the example script.
- `worker.exit_codes` — what a training process's exit code means to the control plane.

No Airflow here; torch is imported by the modules that need it, not by this package.
"""
