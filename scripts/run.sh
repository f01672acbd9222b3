#!/usr/bin/env bash
# The main job on embedded defaults, from a fresh clone: the embedded demo. Installs the package with its demo extras (the `milvus`
# wheel for the source, milvus-lite for the target), then runs python -m server.demo: a source
# Milvus 2.3.5 (embedded etcd + RocksMQ), a Milvus Lite target and the daemon on SQLite, a task,
# sample writes replicated until the target matches, then serving POST /cdc on 127.0.0.1:8444
# until Ctrl-C. Arguments go to the demo: --data-dir DIR (default ./demo-data), --port PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"

pip_args=(--quiet)
# Debian's own interpreter refuses pip outside a virtualenv (PEP 668); install anyway there.
if "$python" -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    pip_args+=(--break-system-packages)
fi
"$python" -m pip --version >/dev/null 2>&1 || { apt-get update && apt-get install -y python3-pip; }
"$python" -m pip install "${pip_args[@]}" -e '.[demo]'
exec "$python" -m server.demo "$@"
