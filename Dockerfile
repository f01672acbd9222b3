# milvus-cdc daemon image (README, "Operating the daemon" > "Docker").
#   docker build -t milvus-cdc .
#   docker run -p 8444:8444 -v milvus-cdc-data:/var/lib/milvus-cdc --stop-timeout 45 milvus-cdc
# Configure with CDC_* environment variables or mount a file over /etc/milvus-cdc/cdc.yaml.
# --stop-timeout (compose: stop_grace_period) must exceed drainTimeoutSeconds + 5 (35 s by
# default): SIGTERM drains the tasks, which save their positions, before the daemon exits.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: the package and its dependencies into a virtualenv (wheels only, no compiler).
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/milvus-cdc
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY replicator ./replicator
COPY metastore ./metastore
RUN /opt/milvus-cdc/bin/pip install --only-binary=:all: . \
    && find /opt/milvus-cdc -name '__pycache__' -prune -exec rm -rf {} +

# Runtime stage: the virtualenv and the configuration, run as an unprivileged user.
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 milvus-cdc \
    && useradd --system --uid 10001 --gid milvus-cdc --home-dir /var/lib/milvus-cdc \
       --create-home --shell /usr/sbin/nologin milvus-cdc
COPY --from=build /opt/milvus-cdc /opt/milvus-cdc
COPY configs/cdc.yaml /etc/milvus-cdc/cdc.yaml
ENV PATH=/opt/milvus-cdc/bin:$PATH \
    CDC_CONFIG=/etc/milvus-cdc/cdc.yaml \
    CDC_LOGFORMAT=json \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/milvus-cdc
# the SQLite metastore (metaStoreConfig.sqlitePath, relative to this directory) lives here
VOLUME ["/var/lib/milvus-cdc"]
EXPOSE 8444
# ready: not draining and the metastore answers (GET /readyz on the default address)
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8444/readyz', timeout=4).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["milvus-cdc"]
CMD ["serve"]
