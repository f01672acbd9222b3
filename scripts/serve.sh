#!/usr/bin/env bash
# The daemon alone, as a service runs it: installs the package with pip, then serves POST /cdc
# on 0.0.0.0:8444 with a SQLite metastore under ./data/ (configs/cdc.yaml's defaults).
# Pass --config PATH (or set CDC_CONFIG) for another configuration; CDC_* variables override keys.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the checkout's virtualenv (scripts/venv.sh); PYTHON=... picks another interpreter
python="${PYTHON:-$(bash scripts/venv.sh)}"

PYTHON="$python" bash scripts/pip-install.sh --quiet -e .
exec "$python" -m server serve "$@"
