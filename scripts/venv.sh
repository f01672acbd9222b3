#!/usr/bin/env bash
# Print the path of the project's virtualenv interpreter (.venv/bin/python in the checkout, or
# $CDC_VENV), making the virtualenv first when it is missing or broken. The three commands
# (run.sh, serve.sh, test.sh) install the project there, never into the system interpreter,
# so they run the daemon as an operator's virtualenv install runs it: a process that escapes to
# the system `python3` (a Spark worker, say) does not find the project's packages there either.
# The virtualenv is made with $CDC_BASE_PYTHON (default python3); Debian's python3 needs the
# python3-venv package for it, installed with apt when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${CDC_VENV:-$PWD/.venv}"
base="${CDC_BASE_PYTHON:-python3}"

if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    rm -rf "$venv"
    if ! "$base" -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        echo "venv: $base -m venv failed; installing python3-venv with apt" >&2
        as_root=()
        [ "$(id -u)" -eq 0 ] || as_root=(sudo)
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update >&2
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv >&2
        "$base" -m venv "$venv" >&2
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    echo "venv: made $venv" >&2
fi
echo "$venv/bin/python"
