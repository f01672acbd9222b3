#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing (etcd-server,
# mariadb-server, ... with apt; the project and its Python packages with pip into the checkout's
# virtualenv .venv/, made by scripts/venv.sh, never into the system interpreter, so the suite runs
# the daemon as a virtualenv install runs it), then lint, types, and every test —
# unit, integration (real etcd, MariaDB, Milvus Lite started on free loopback ports) and e2e.
# Extra arguments go to pytest, e.g. scripts/test.sh -k metastore
# CDC_TEST_WORKERS=2 runs the tests in two pytest-xdist workers, a test file per worker at a
# time and the files that run Spark in one worker (tests/conftest.py), each worker with its own
# services (etcd, MariaDB, Kafka mock, Milvus) on free ports: 16-19 minutes on two cores
# instead of 27-29, but a test with a 2-second lease failed under that load once in four runs.
# The default, 0, runs them in this one process.
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
# pytest-benchmark, when installed, warns that xdist disables it (and warnings are errors)
exec "$python" -m pytest -p no:cacheprovider -p no:benchmark \
    -n "${CDC_TEST_WORKERS:-0}" --dist loadgroup "$@"
