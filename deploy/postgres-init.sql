-- One Postgres server, one database per component (docker-compose.yaml).
CREATE DATABASE airflow;
CREATE DATABASE mlflow;
