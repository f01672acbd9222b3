#!/usr/bin/env bash
# Install what the test suite needs, idempotently:
#   - etcd-server, mariadb-server, chromium, openjdk-17-jre-headless and prometheus (for
#     promtool) from Debian, only when etcd / mariadbd / chromium / java / promtool are missing
#     (one `apt-get update` first, since a fresh machine has empty package lists);
#   - this project in editable mode with its `test` extra (pytest, milvus-lite, ...).
# Meant for Debian 12, run as root (sudo is used when available otherwise).
# PYTHON selects the interpreter (default: python3); use a virtualenv's python to keep the
# system interpreter untouched.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"

have() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]
}

packages=()
have etcd || packages+=(etcd-server)
{ have mariadbd && have mariadb-install-db; } || packages+=(mariadb-server)
# Debian's chromium for the dashboard's browser tests (driven over the DevTools protocol).
have chromium || packages+=(chromium)
# Java 17 for pyspark (the backfill job's Spark driver and executors).
have java || packages+=(openjdk-17-jre-headless)
# promtool (in Debian's prometheus package) checks and unit-tests deployment/prometheus/alerts.yml.
have promtool || packages+=(prometheus)
# jq: the DR drill of the docs (docs/guides/dr-drill.md) reads answers with it, and its test runs it.
have jq || packages+=(jq)
# A fresh Debian 12 has python3 but not pip.
"$python" -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)

if [ "${#packages[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        as_root=(env)
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo env)
    else
        echo "install-test-deps: need root (or sudo) to install: ${packages[*]}" >&2
        exit 1
    fi
    echo "install-test-deps: installing ${packages[*]}" >&2
    "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update
    # The packages try to start their system services on install; without an init system
    # that fails harmlessly. The tests start their own instances on free loopback ports.
    "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${packages[@]}"
fi

cd "$repo_root"
PYTHON="$python" bash scripts/pip-install.sh -e '.[test]'
