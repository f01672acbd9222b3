# milvus-cdc daemon image (README, "Operating the daemon" > "Docker").
#   docker build -t milvus-cdc .                      # default: with backfill (PySpark + JRE 17)
#   docker build --target slim -t milvus-cdc:slim .   # without Spark and Java: no backfill
#   docker run -p 8444:8444 -v milvus-cdc-data:/var/lib/milvus-cdc --stop-timeout 45 milvus-cdc
# Configure with CDC_* environment variables or mount a file over /etc/milvus-cdc/cdc.yaml.
# --stop-timeout (compose: stop_grace_period) must exceed drainTimeoutSeconds + 5 (35 s by
# default): SIGTERM drains the tasks, which save their positions, before the daemon exits.
# PYTHON_IMAGE: any Debian 12 (bookworm) image with python3 3.11 and its venv module; without
# Docker Hub, scripts/build-image.sh makes one with debootstrap and passes it here.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: the package and its dependencies into a virtualenv (wheels only, no compiler).
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/milvus-cdc
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY replicator ./replicator
COPY metastore ./metastore
# pip-ca (optional build secret): a CA bundle for pip behind a TLS-intercepting proxy, e.g.
#   --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt (scripts/build-image.sh does this)
RUN --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/milvus-cdc/bin/pip install --only-binary=:all: . \
    && find /opt/milvus-cdc -name '__pycache__' -prune -exec rm -rf {} +

# The same virtualenv with the backfill extra. pyspark is published as a source archive only
# (pure Python with Spark's jars inside): it alone is built from source, with no compiler.
FROM build AS build-backfill
RUN --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/milvus-cdc/bin/pip install --only-binary=:all: --no-binary=pyspark '.[backfill]' \
    && find /opt/milvus-cdc -name '__pycache__' -prune -exec rm -rf {} +

# What both images share: the user, the configuration, the environment.
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 milvus-cdc \
    && useradd --system --uid 10001 --gid milvus-cdc --home-dir /var/lib/milvus-cdc \
       --create-home --shell /usr/sbin/nologin milvus-cdc
COPY configs/cdc.yaml /etc/milvus-cdc/cdc.yaml
ENV PATH=/opt/milvus-cdc/bin:$PATH \
    CDC_CONFIG=/etc/milvus-cdc/cdc.yaml \
    CDC_LOGFORMAT=json \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
WORKDIR /var/lib/milvus-cdc
# the SQLite metastore (metaStoreConfig.sqlitePath, relative to this directory) lives here
VOLUME ["/var/lib/milvus-cdc"]
EXPOSE 8444
# ready: not draining and the metastore answers (GET /readyz on the default address)
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8444/readyz', timeout=4).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["milvus-cdc"]
CMD ["serve"]

# `--target slim`: the daemon without Spark and Java; a backfill request is refused with a
# message naming what is missing.
FROM runtime AS slim
COPY --from=build /opt/milvus-cdc /opt/milvus-cdc
USER 10001:10001

# The default image: the daemon with the backfill extra (pyspark) and a headless Java 17
# runtime, so `backfill` requests run their Spark job (local[*]) inside the container.
FROM runtime AS full
# slim Debian images leave out /usr/share/man, where the JRE's postinst puts alternatives
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(dirname "$(dirname "$(readlink -f /usr/bin/java)")")" /usr/lib/jvm/java-17
ENV JAVA_HOME=/usr/lib/jvm/java-17
COPY --from=build-backfill /opt/milvus-cdc /opt/milvus-cdc
USER 10001:10001
