"""``milvus-cdc task ...`` is run by hand and by scripts many times: building its parser and
reading the settings loads no driver, no Milvus client and not the daemon (server/cli/main.py
imports a command's work when it runs)."""

from __future__ import annotations

import os
import subprocess
import sys

HEAVY = ("pymilvus", "pandas", "sqlalchemy", "aiohttp", "grpc", "confluent_kafka", "etcd3")


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    # the settings read CDC_* variables: the suite's own (CDC_TEST_*) are no settings
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return set(done.stdout.split())


def test_the_parser_and_the_settings_load_no_driver():
    assert (
        loaded_after(
            "from server.cli.main import build_parser\n"
            "from replicator.config.settings import load_settings\n"
            "build_parser().parse_args(['task', 'list'])\n"
            "load_settings(None)"
        )
        == set()
    )


def test_a_task_commands_work_loads_none_either():
    assert loaded_after("from server.cli.main import runner\nrunner('task')") == set()


def test_the_daemons_work_is_loaded_when_it_runs():
    """The probe can see a driver: serve's module brings the daemon, aiohttp and the rest."""
    assert {"aiohttp", "pymilvus"} <= loaded_after(
        "from server.cli.main import runner\nrunner('serve')"
    )
