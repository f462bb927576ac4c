"""The `trainyard` command: one module per group of subcommands (`main.py` wires them), each a thin
layer over the engines under `plugins/` — validate, plan, place, launch, submit to Airflow, follow
runs, checkpoints, models, data and the local stack. Output through `output.py` (rich)."""
