"""`python -m trainyard.dags` prints the DAG file to save in an Airflow's DAGs folder."""

from trainyard.config.airflow import DAG_FILE

print(DAG_FILE, end="")
