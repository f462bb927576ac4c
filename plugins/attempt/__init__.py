"""The attempt engine: one attempt of a training run as plain functions over the other engines
(`steps.py`: open, check the data, plan, place, launch, follow, conclude, close), what watches it
(`watching.py`), stops it (`stop.py`, `preempt.py`), scopes its ranks' storage keys
(`storage_access.py`) and records it (`bookkeeping.py`, `closing.py`). The DAG's operators and `trainyard launch` both call these, so they cannot differ."""
