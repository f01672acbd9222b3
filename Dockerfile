# milvus-cdc daemon image: docker build -t milvus-cdc . && docker run -p 8444:8444 milvus-cdc
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY replicator ./replicator
COPY metastore ./metastore
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --create-home --home-dir /var/lib/milvus-cdc milvus-cdc
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY configs/cdc.yaml /etc/milvus-cdc/cdc.yaml
USER milvus-cdc
WORKDIR /var/lib/milvus-cdc
ENV CDC_CONFIG=/etc/milvus-cdc/cdc.yaml CDC_LOGFORMAT=json PYTHONUNBUFFERED=1
EXPOSE 8444
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8444/readyz', timeout=4).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["milvus-cdc"]
CMD ["serve"]
