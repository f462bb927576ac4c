"""The recovery engine: classify how an attempt ended, decide what to do next, hand the next
attempt its conf, and keep each training run's lifecycle in the platform state. Pure Python:
the demo, `trainyard launch` and the Airflow DAG all call it (DESIGN §1, §5)."""
