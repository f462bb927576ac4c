"""Tracking: every run and model in MLflow, with lineage, cost and MFU (DESIGN §1, issue 8).

| module | what |
|---|---|
| `metrics` | `MetricsStreamer`: async, batched metrics from rank 0 (never blocks training) |
| `runs` | one experiment per team/project, one run per job across attempts; params, lineage
  tags, recovery events, committed checkpoints (URI + SHA-256), the dataset as run input |
| `system_metrics` | MLflow's system-metrics sampler attached to the job's run |
| `datasets` | dataset identity (canonical URI, version, digest) and row samples |
| `registry` | checkpoint → safetensors LoggedModel → model version + `candidate` alias;
  `models_trained_on(dataset, version)` |
| `rates`, `cost` | GPU rates, GPU-hours by phase, cost, MFU, chargeback (CSV/HTML/MLflow) |
| `safetensors_pyfunc` | the registered model's code (MLflow "model from code"; not imported) |

Heavy libraries (mlflow, pandas, torch) are imported inside functions, never at module level.
"""
