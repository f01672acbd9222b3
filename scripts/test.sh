#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing (etcd-server,
# mariadb-server, ... with apt; the project and its Python packages with pip into the checkout's
# virtualenv .venv/, made by scripts/venv.sh, never into the system interpreter, so the suite runs
# the daemon as a virtualenv install runs it), then lint, types, and every test —
# unit, integration (real etcd, MariaDB, Milvus Lite started on free loopback ports) and e2e.
# Extra arguments go to pytest, e.g. scripts/test.sh -k metastore
# The tests run in three pytest-xdist workers (CDC_TEST_WORKERS, default 3; 0 runs them in this
# one process), the tests of the files that run Spark one after the other in one worker and every
# other test in whichever worker is free (tests/conftest.py), each worker with its own services
# (etcd, MariaDB, Kafka mock, Milvus) on free ports. With workers, CDC_TEST_TIME_SCALE (default
# 2) lengthens the leases of the lease tests, which a loaded machine once made expire between two
# writes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# the checkout's virtualenv (scripts/venv.sh); PYTHON=... picks another interpreter
python="${PYTHON:-$(bash scripts/venv.sh)}"

PYTHON="$python" bash scripts/install-test-deps.sh
echo "== ruff"
"$python" -m ruff check .
"$python" -m ruff format --check .
echo "== mypy"
"$python" -m mypy
echo "== pytest"
export no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
workers="${CDC_TEST_WORKERS:-3}"
if [ "$workers" != 0 ]; then
    export CDC_TEST_TIME_SCALE="${CDC_TEST_TIME_SCALE:-2}"
fi
# pytest-benchmark, when installed, warns that xdist disables it (and warnings are errors)
exec "$python" -m pytest -p no:cacheprovider -p no:benchmark \
    -n "$workers" --dist loadgroup "$@"
