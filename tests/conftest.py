"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TypeVar

import pytest

try:  # tests/ has no __init__.py, so pytest puts tests/ itself on sys.path
    # (the fallback covers tests/ becoming a package)
    from harness import services
except ImportError:  # pragma: no cover
    from tests.harness import services

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Real services
#
# Started once per test session on free loopback ports under pytest's temporary directory and
# stopped by PID at the end. Isolate tests by collection/database/key-prefix names, not by
# restarting servers. A missing binary fails the test (it does not skip): run scripts/test.sh,
# which installs etcd-server, mariadb-server and the Python test extras first.


def _serve(
    factory: Callable[[Path], AbstractContextManager[T]],
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
) -> Iterator[T]:
    with contextlib.ExitStack() as stack:
        try:
            service = stack.enter_context(factory(tmp_path_factory.mktemp(name)))
        except services.MissingBinaryError as exc:
            missing = str(exc)
        else:
            missing = None
        if missing is not None:  # outside the except block: no chained traceback
            pytest.fail(
                f"{name}: {missing}. Run scripts/test.sh (it installs the test dependencies).",
                pytrace=False,
            )
        yield service


@pytest.fixture(scope="session")
def etcd_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.EtcdService]:
    yield from _serve(services.etcd_server, tmp_path_factory, "etcd")


@pytest.fixture(scope="session")
def mariadb_service(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[services.MariaDBService]:
    yield from _serve(services.mariadb_server, tmp_path_factory, "mariadb")


@pytest.fixture(scope="session")
def milvus_lite_service(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[services.MilvusLiteService]:
    yield from _serve(services.milvus_lite_server, tmp_path_factory, "milvus-lite")
