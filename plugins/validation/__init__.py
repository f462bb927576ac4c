"""Checks a job before any accelerator is allocated, every problem at once (DESIGN §3): the dry
run over the spec and the cluster (`dry_run.py`), memory fit (`memory.py`), team quota
(`quota.py`), the worker runtime (`runtime.py`), the dataset's presence (`dataset.py`) and its
quality with Great Expectations (`data_quality.py`)."""
