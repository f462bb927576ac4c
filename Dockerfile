# One image for the control plane (Airflow, MLflow), the node agent and CPU workers.
# GPU workers use the team's own image (spec.image) with `trainyard` installed on top.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    TRAINYARD_HOME=/var/lib/trainyard PYTHONPATH=/opt/trainyard
WORKDIR /opt/trainyard

RUN apt-get update && apt-get install -y --no-install-recommends git tini curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 50000 trainyard \
    && mkdir -p /var/lib/trainyard /var/run/trainyard/heartbeats \
    && chown -R trainyard /var/lib/trainyard /var/run/trainyard

# Dependencies first (cached layer): the lock, with torch's CPU build from PyTorch's index.
COPY pyproject.toml constraints.txt README.md ./
RUN mkdir -p config plugins worker node_agent operators sensors dags cli \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt '.[test]' \
    && pip uninstall -y trainyard

COPY . .
RUN pip install --no-deps -e . && chown -R trainyard /opt/trainyard
USER trainyard
ENTRYPOINT ["tini", "--"]
CMD ["trainyard", "--help"]
