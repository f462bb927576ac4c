# Two images from one file, each with what runs there (pyproject.toml's extras):
#   --target training       the core only: the worker runtime, checkpoints, data, the MLflow client
#                           and the node agent — what a rank's pod and the node-agent DaemonSet run.
#                           No Airflow, no Great Expectations, no MLflow server. GPU teams install
#                           `trainyard` the same way on top of their own image (spec.image).
#   --target control-plane  everything (`.[all]`): Airflow with Trainyard as a provider, the MLflow
#                           server; docker-compose.yaml builds it. Its DAGs folder holds the one
#                           Trainyard DAG file (`python -m trainyard.dags`), its plugins folder
#                           nothing: the provider brings the operators and the Trainyard view.
# Trainyard is installed as a regular package (a wheel built from this folder), never put on
# PYTHONPATH: nothing bare (`config`, `operators`, …) lands beside the user's own modules.
FROM python:3.11-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    TRAINYARD_HOME=/var/lib/trainyard
WORKDIR /opt/trainyard

RUN apt-get update && apt-get install -y --no-install-recommends git tini curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 50000 trainyard \
    && mkdir -p /var/lib/trainyard /var/run/trainyard/heartbeats \
    && chown -R trainyard /var/lib/trainyard /var/run/trainyard
COPY pyproject.toml setup.py constraints.txt README.md ./
RUN mkdir -p trainyard config plugins worker node_agent operators sensors dags cli
ENTRYPOINT ["tini", "--"]

FROM base AS training
# Dependencies first (a cached layer), with torch's CPU build from PyTorch's index.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt . \
    && pip uninstall -y trainyard
COPY . .
RUN pip install --no-deps . && rm -rf build
USER trainyard
CMD ["trainyard", "--help"]

FROM base AS control-plane
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt '.[all]' \
    && pip uninstall -y trainyard
COPY . .
RUN pip install --no-deps . && rm -rf build \
    && mkdir -p /opt/airflow/dags /opt/airflow/plugins \
    && python -m trainyard.dags > /opt/airflow/dags/trainyard_dags.py \
    && chown -R trainyard /opt/trainyard /opt/airflow
USER trainyard
CMD ["trainyard", "--help"]
