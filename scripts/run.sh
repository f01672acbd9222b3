#!/usr/bin/env bash
# The main job on embedded defaults, from a fresh clone: the embedded demo. Installs the package with its demo extras (the `milvus`
# wheel for the source, milvus-lite for the target), then runs python -m server.demo: a source
# Milvus 2.3.5 (embedded etcd + RocksMQ), a Milvus Lite target and the daemon on SQLite, a task,
# sample writes replicated until the target matches, then serving POST /cdc on 127.0.0.1:8444
# until Ctrl-C. Arguments go to the demo: --data-dir DIR (default ./demo-data), --port PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"

bash scripts/pip-install.sh --quiet -e '.[demo]'
exec "$python" -m server.demo "$@"
