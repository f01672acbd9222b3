"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

try:  # tests/ has no __init__.py, so pytest puts tests/ itself on sys.path
    # (the fallback covers tests/ becoming a package)
    from harness import services
except ImportError:  # pragma: no cover
    from tests.harness import services

if TYPE_CHECKING:
    from harness.daemon import Daemon
    from harness.kafka_mock import KafkaMock
    from harness.milvus_source import MilvusSource

    from metastore import MetaStore

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


# The URIs of the session's Milvus servers that are up: what a test creates on them is dropped
# when it ends (harness/collection_sweep.py says why).
SHARED_MILVUS: dict[str, None] = {}


class _HasUri(Protocol):
    uri: str


S = TypeVar("S", bound=_HasUri)


def _shared(served: Iterator[S]) -> Iterator[S]:
    for service in served:
        SHARED_MILVUS[service.uri] = None
        try:
            yield service
        finally:
            SHARED_MILVUS.pop(service.uri, None)


# The fixtures through which a test reaches them: the servers', and the ones that ask for a
# server when they run ("target": e2e/conftest.py, "env": test_stream_ddl_apply.py)
MILVUS_FIXTURES = {"milvus_source", "milvus_source_rocksmq", "milvus_lite_service", "target", "env"}


@pytest.fixture(autouse=True)
def _drop_what_the_test_created(request: pytest.FixtureRequest) -> Iterator[None]:
    if MILVUS_FIXTURES.isdisjoint(request.fixturenames):
        yield
        return
    from harness.collection_sweep import sweeping

    with sweeping(lambda: list(SHARED_MILVUS)):
        yield


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
    yield from _shared(_serve(services.milvus_lite_server, tmp_path_factory, "milvus-lite"))


# ---------------------------------------------------------------------------------------------
# Metastores: one factory per backend, each opening a store on a real server under a root path.

StoreOpener = Callable[[str], "MetaStore"]
BACKENDS = ["sqlite", "mysql", "etcd"]


@pytest.fixture(params=BACKENDS)
def store_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreOpener]:
    """Opens stores of one backend; every store opened is closed at the end of the test."""
    from metastore.etcd import EtcdMetaStore
    from metastore.etcd_connect import connect_etcd
    from metastore.sql import SqlMetaStore
    from metastore.sql_urls import mysql_url_from_source, sqlite_url

    backend = request.param
    if backend == "sqlite":
        url = sqlite_url(str(tmp_path / "meta.sqlite3"))

        def opener(root: str) -> MetaStore:
            return SqlMetaStore(url, root)
    elif backend == "mysql":
        service = request.getfixturevalue("mariadb_service")
        url = mysql_url_from_source(service.go_dsn)  # the Go tool's DSN form, as cdc.yaml has it

        def opener(root: str) -> MetaStore:
            return SqlMetaStore(url, root)
    else:
        service = request.getfixturevalue("etcd_service")

        def opener(root: str) -> MetaStore:
            return EtcdMetaStore(connect_etcd([service.endpoint]), root)

    opened: list[MetaStore] = []

    def tracked(root: str) -> MetaStore:
        store = opener(root)
        opened.append(store)
        return store

    yield tracked
    for store in opened:
        store.close()


@pytest.fixture
def root_path() -> str:
    """A root path of its own for each test, so tests sharing a server never see each other."""
    import uuid

    return f"test-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------------------------------
# The daemon under test


MADE_DAEMONS = pytest.StashKey[list["Daemon"]]()
FAILED_DAEMON_LOG_LINES = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the last lines of each daemon it made: the logs live in
    the test's temporary directory, which a CI machine does not keep."""
    report = yield
    if report.failed:
        for daemon in item.stash.get(MADE_DAEMONS, []):
            tail = services.log_tail(daemon.log_path, lines=FAILED_DAEMON_LOG_LINES)
            report.sections.append((f"daemon log {daemon.log_path}", tail or "(empty)"))
    return report


@pytest.fixture
def daemon_factory(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Daemon]]:
    """Makes daemons (not started) with a SQLite store under the test's directory, a real,
    empty source (the session's etcd and Kafka mock under a prefix no Milvus writes to) and an
    admin token that the daemon object sends (unless ``auth`` is given) by default; every
    daemon made is stopped at the end."""
    import uuid

    from harness.daemon import Daemon

    made: list[Daemon] = []
    request.node.stash[MADE_DAEMONS] = made  # their logs go in a failure's report

    def make(name: str = "daemon", **config: object) -> Daemon:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        settings: dict[str, object] = {
            "metaStoreConfig": {"storeType": "sqlite", "sqlitePath": str(workdir / "meta.db")},
            # absolute, so commands run from elsewhere (milvus-cdc check) read the same key
            "secrets": {"keyFile": str(workdir / "data" / "cdc-secret.key")},
            "drainTimeoutSeconds": 5,
        }
        if "sourceConfig" not in config:
            etcd = request.getfixturevalue("etcd_service")
            kafka = request.getfixturevalue("kafka_mock")
            settings["sourceConfig"] = {
                "etcd": {"address": [etcd.endpoint]},
                "etcdRootPath": "no-source",
                "kafka": {"address": kafka.bootstrap},
                "dmlChannelNum": 2,
            }
        token = None
        if "auth" not in config:  # the API as operators should run it: with a token
            token = f"test-admin-{uuid.uuid4().hex}"
            settings["auth"] = {"tokens": [{"name": "test-admin", "role": "admin", "token": token}]}
        settings.update(config)
        daemon = Daemon(workdir=workdir, config=settings, token=token)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()


# ---------------------------------------------------------------------------------------------
# Milvus source on Kafka
#
# A librdkafka mock Kafka cluster (in a child process of its own) and a real Milvus 2.3.5
# standalone from the PyPI `milvus` wheel whose WAL is on that Kafka and whose metadata is in
# the session's etcd (root path and channel prefix "by-dev", Milvus's defaults). Tests read the
# source's etcd keys under "by-dev/meta/..." and its topics "by-dev-rootcoord-dml_<n>".
# Isolate tests by collection names.


@pytest.fixture(scope="session")
def kafka_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaMock]:
    from harness.kafka_mock import kafka_mock_cluster

    yield from _serve(kafka_mock_cluster, tmp_path_factory, "kafka-mock")


@pytest.fixture(scope="session")
def milvus_source(
    tmp_path_factory: pytest.TempPathFactory,
    etcd_service: services.EtcdService,
    kafka_mock: KafkaMock,
) -> Iterator[MilvusSource]:
    from harness.milvus_source import milvus_source as start_milvus_source

    def factory(workdir: Path) -> AbstractContextManager[MilvusSource]:
        return start_milvus_source(workdir, etcd_service.endpoint, kafka_mock.bootstrap)

    yield from _shared(_serve(factory, tmp_path_factory, "milvus-source"))


@pytest.fixture(scope="session")
def milvus_source_rocksmq(
    tmp_path_factory: pytest.TempPathFactory, etcd_service: services.EtcdService
) -> Iterator[MilvusSource]:
    """A second real Milvus 2.3.5 whose WAL is RocksMQ (a standalone on this host), metadata in
    the session's etcd under a root path of its own."""
    import uuid

    from harness.milvus_source import milvus_source_rocksmq as start

    root = f"rmq-{uuid.uuid4().hex[:10]}"

    def factory(workdir: Path) -> AbstractContextManager[MilvusSource]:
        return start(workdir, etcd_service.endpoint, root_path=root)

    yield from _shared(_serve(factory, tmp_path_factory, "milvus-rocksmq"))


# ---------------------------------------------------------------------------------------------
# Test workers (CDC_TEST_WORKERS, pytest-xdist with --dist loadgroup): the tests of the files that
# run Spark jobs are one group, run by one worker one after the other, so two Spark drivers never
# compete for the two cores while each waits for its own copy; every other test is handed out on
# its own to whichever worker is free, which keeps both busy to the end. xdist hands out the
# largest group first (by number of tests): the Spark group, then the rest in collection order.
#
# The scheduler below makes the group from the node ids. xdist's own loadgroup reads xdist_group
# marks into the node ids, which pytest 9 no longer lets a plugin change (Node.nodeid is
# read-only): with marks, every test was a group of its own and the Spark files ran on both
# workers at once.

SPARK_FILES = {
    "test_backfill.py",
    "test_backfill_boundaries.py",
    "test_bulk_import.py",
    "test_demo.py",
    "test_disaster_failback.py",
    # the DR drill of the docs runs a failback (a Spark backfill)
    "test_docs_guides.py",
    "test_field_types_backfill.py",
    "test_milvus_mtls.py",
    "test_milvus_tls_target.py",
    "test_stream_types_backfill.py",
    "test_spark_scratch.py",
    "test_verify.py",
}


def xdist_group_of(nodeid: str) -> str:
    """The group of a test: "spark" for the tests of SPARK_FILES, else its node id."""
    path = nodeid.split("::", 1)[0]
    return "spark" if path.rsplit("/", 1)[-1] in SPARK_FILES else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SparkGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return SparkGroupScheduling(config, log)
