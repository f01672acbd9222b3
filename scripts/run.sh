#!/usr/bin/env bash
# The main job on embedded defaults, from a fresh clone: the embedded demo. Installs the package
# with its demo extras (the `milvus` wheel for the source, milvus-lite for the target; with a
# Java runtime, also the backfill extra, pyspark), then runs python -m server.demo: a source
# Milvus 2.3.5 (embedded etcd + RocksMQ), a Milvus Lite target and the daemon on SQLite, a task,
# sample writes replicated until the target matches, a backfill of rows written before its task
# (only with Java; otherwise the demo says it is skipped), then serving POST /cdc on
# 127.0.0.1:8444 until Ctrl-C. Arguments go to the demo: --data-dir DIR (default ./demo-data),
# --port PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the checkout's virtualenv (scripts/venv.sh); PYTHON=... picks another interpreter
python="${PYTHON:-$(bash scripts/venv.sh)}"

extras=demo
if command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]; then
    extras=demo,backfill
fi
PYTHON="$python" bash scripts/pip-install.sh --quiet -e ".[$extras]"
exec "$python" -m server.demo "$@"
