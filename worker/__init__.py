"""The in-training runtime: what a training script imports to be a good citizen of the platform.

- `trainyard.worker.session.TrainingSession` — the callback (seed Appendix B): process group, restore,
  checkpoint cadence, heartbeats, divergence, SIGTERM, MLflow metrics.
- `trainyard.worker.distributed.parallelize.parallelize(model, plan, mesh)` — apply an advisor `Plan`
  with torch's own DDP / FSDP2 / DTensor TP / pipelining / activation checkpointing.
- `trainyard.worker.data.open_streaming_data` — the dataset streamed from the object store through the
  node's bounded cache (`trainyard.plugins.data.reader`), prefetched in the background, resumable at the
  exact next sample on any data-parallel size; `trainyard.worker.sampler.ResumableSampler` does the same
  for an in-memory dataset addressed by index (`trainyard.worker.data.TokenWindows`).
- `trainyard.worker.stall.StallMonitor` — warns when the loop waits for data more than 5 % of the time.
- `trainyard.worker.models.llama` — the example model; `worker/train.py` — the example script.
- `trainyard.plugins.run.exit_codes` — what a training process's exit code means to the control plane.

No Airflow here; torch is imported by the modules that need it, not by this package.
"""
