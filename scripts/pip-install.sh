#!/usr/bin/env bash
# pip install "$@" into $PYTHON (default python3), from the repository root. Installs pip with
# apt when the interpreter has none. Debian's own interpreter is "externally managed" (PEP 668)
# and refuses pip outside a virtualenv; there the install goes ahead with
# --break-system-packages. Used by run.sh, serve.sh and install-test-deps.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"

"$python" -m pip --version >/dev/null 2>&1 || { apt-get update && apt-get install -y python3-pip; }
pip_args=()
if "$python" - <<'PY'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if (not in_venv and os.path.exists(marker)) else 1)
PY
then
    pip_args+=(--break-system-packages)
fi
exec "$python" -m pip install "${pip_args[@]}" "$@"
