"""What the platform is told: the `TrainingJob` spec and its rules (`spec.py`, `rules.py`,
`problems.py`), the clusters and teams (`cluster.py`, `teams.py` and their YAML), the settings of a
home (`settings.py`), the worker's environment contract (`worker_env.py`) and the one DAG file
Airflow reads (`airflow.py`). Light to import: DAG parsing and every rank read it."""
