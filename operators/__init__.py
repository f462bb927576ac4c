"""The Airflow operators of a job's DAG: thin tasks over the attempt engine (`plugins/attempt/`)
— validate, plan, place, launch, classify, recover, register — and the extra links they show.
The only package besides `sensors/` and `dags/` that imports Airflow."""
