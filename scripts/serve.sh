#!/usr/bin/env bash
# The daemon alone, as a service runs it: installs the package with pip, then serves POST /cdc
# on 0.0.0.0:8444 with a SQLite metastore under ./data/ (configs/cdc.yaml's defaults).
# Pass --config PATH (or set CDC_CONFIG) for another configuration; CDC_* variables override keys.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"

pip_args=(--quiet)
# Debian's own interpreter refuses pip outside a virtualenv (PEP 668); install anyway there.
if "$python" -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    pip_args+=(--break-system-packages)
fi
"$python" -m pip --version >/dev/null 2>&1 || { apt-get update && apt-get install -y python3-pip; }
"$python" -m pip install "${pip_args[@]}" -e .
exec "$python" -m server serve "$@"
