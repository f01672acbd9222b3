"""A real Milvus 2.3.5 standalone (from the PyPI ``milvus`` wheel) as the replication source.

Its metadata goes to an external etcd (under ``<root_path>/meta/...``) and its WAL to a Kafka
protocol broker (the librdkafka mock of kafka_mock.py) or to RocksMQ under its own directory, so
tests can read both the way the daemon does. Several instances can share one etcd and one Kafka:
give each its own ``root_path`` and ``chan_prefix``.

How the wheel is used: ``milvus.MilvusServerConfig`` renders the wheel's config template
(``{{ name(type): default }}`` placeholders, every ``*_port`` one set here to a free port; other
keys are replaced through its "extra configs") into ``<base_dir>/configs/milvus.yaml``. The
binary is unpacked once per wheel into a cache directory and hard-linked into ``<base_dir>/bin``.
We run ``bin/milvus run standalone`` ourselves (cwd = base dir, LD_LIBRARY_PATH = bin) instead of
``MilvusServer.start()``, whose ``wait_started()`` keeps waiting 180 s after the process died and
whose ``stop()`` kills after 1 s. Settings are also passed as environment variables, which Milvus
prefers to the yaml (``ETCD_ROOTPATH`` = ``etcd.rootPath``: lower-cased, ``_`` and ``.`` ignored).

Stopping: SIGTERM, 2 s grace, then SIGKILL (a graceful stop can take very long, and the data is
disposable). Milvus also writes ``/tmp/milvus/server_id_<pid>`` and ``/run/milvus/standalone.pid``
outside its directory; both are removed after the stop when they are this instance's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.services import (
    LOOPBACK,
    MissingBinaryError,
    ServiceStartError,
    _port_open,
    _running,
    wait_until,
)
from server.demo import MILVUS_ENV_PREFIXES, local_milvus
from server.demo.ports import free_ports

DEFAULT_ROOT_PATH = "by-dev"
DML_CHANNEL_NUM = 16  # rootCoord.dmlChannelNum in the wheel's template
GRACEFUL_STOP_TIMEOUT_S = 5  # common.gracefulStopTimeout (default 1800 s): an orphan exits soon
STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this many seconds
# Components whose `<component>.ip` is the address they register in etcd (default: the host's
# first unicast address, not loopback); they listen on every interface whatever it says.
_COMPONENTS = (
    "rootCoord",
    "proxy",
    "queryCoord",
    "queryNode",
    "indexNode",
    "dataCoord",
    "dataNode",
)

# Environment variables whose names Milvus would read as settings: dropped from the inherited
# environment so the caller's shell cannot reconfigure the instance (the demo's list).
_MILVUS_ENV_PREFIXES = MILVUS_ENV_PREFIXES


@dataclass(frozen=True, kw_only=True)
class MilvusSource:
    uri: str  # "http://127.0.0.1:PORT" (pymilvus: MilvusClient(uri=..., dedicated=True))
    host: str
    port: int  # the proxy's gRPC (and RESTful) port
    pid: int
    etcd_endpoint: str  # "127.0.0.1:PORT"
    etcd_root_path: str  # metadata under f"{etcd_root_path}/meta/root-coord/..."
    chan_prefix: str  # pchannels f"{chan_prefix}-rootcoord-dml_{n}"
    mq_type: str  # "kafka" or "rocksmq"
    kafka_bootstrap: str | None
    rocksmq_path: Path | None
    metrics_port: int  # /healthz, /metrics
    ports: Mapping[str, int] = field(default_factory=dict)  # template key -> port
    base_dir: Path
    log_path: Path  # the process's stdout and stderr (Milvus also writes base_dir/logs/)

    @property
    def meta_root(self) -> str:
        return f"{self.etcd_root_path}/meta"

    @property
    def dml_channels(self) -> list[str]:
        """Every pchannel (Kafka topic / RocksMQ topic) this instance may write DML to."""
        return [f"{self.chan_prefix}-rootcoord-dml_{n}" for n in range(DML_CHANNEL_NUM)]

    @property
    def replicate_channel(self) -> str:
        return f"{self.chan_prefix}-replicate-msg"


# --------------------------------------------------------------------------------------------
# The binary: unpacked once per wheel, hard-linked into each instance's bin/


def _default_cache_root() -> Path:
    configured = os.environ.get("MILVUS_CDC_TEST_CACHE")
    return Path(configured) if configured else local_milvus.default_cache_root("milvus-cdc-tests")


def _install_bin(base_dir: Path, cache_root: Path | None) -> Path:
    """Make `base_dir`/bin hold the Milvus binary and its libraries; returns that directory."""
    try:
        return local_milvus.install_bin(base_dir, cache_root or _default_cache_root())
    except local_milvus.NotInstalledError as exc:
        raise MissingBinaryError(
            f"{exc}; install the Python test extras (pip install -e '.[test]')"
        ) from exc


# --------------------------------------------------------------------------------------------
# Starting and stopping


def _host_port(endpoint: str) -> str:
    """ "http://127.0.0.1:2379" or "127.0.0.1:2379" -> "127.0.0.1:2379"."""
    for scheme in ("http://", "https://"):
        if endpoint.startswith(scheme):
            endpoint = endpoint[len(scheme) :]
    return endpoint.rstrip("/")


def _is_milvus_setting(name: str) -> bool:
    upper = name.upper()
    return any(upper.startswith(prefix) for prefix in _MILVUS_ENV_PREFIXES)


def _lists_collections(uri: str, port: int, client: Mapping[str, Any] | None = None) -> bool:
    if not client:
        return _port_open(port) and local_milvus.lists_collections(uri)
    from pymilvus import MilvusClient

    _port_open(port)
    milvus = MilvusClient(uri=uri, timeout=3, dedicated=True, **client)
    try:
        milvus.list_collections(timeout=3)
    finally:
        milvus.close()
    return True


def _env_name(key: str) -> str:
    """The environment variable Milvus reads for a yaml key (``tls.serverPemPath`` ->
    ``TLS_SERVERPEMPATH``)."""
    return key.replace(".", "_").upper()


@dataclass(frozen=True)
class _Prepared:
    """One instance's configuration written to its directory: how to run it, and what it is
    once it runs (``source`` without its pid)."""

    argv: list[str]
    env: dict[str, str]
    source: MilvusSource
    what: str
    client: Mapping[str, Any] | None = None  # MilvusClient arguments of its readiness probe


def _prepare_standalone(
    workdir: Path,
    etcd_endpoint: str,
    *,
    mq_type: str,
    kafka_bootstrap: str | None,
    root_path: str,
    chan_prefix: str | None,
    bin_cache: Path | None,
    settings: Mapping[str, str] | None = None,
    client: Mapping[str, Any] | None = None,
) -> _Prepared:
    """``settings``: more milvus.yaml keys (TLS, authorization); ``client``: the pymilvus
    ``MilvusClient`` arguments its readiness is asked with then (TLS files, a token)."""
    from milvus import MilvusServerConfig

    base_dir = workdir.resolve()
    base_dir.mkdir(parents=True, exist_ok=True)
    chan_prefix = chan_prefix or root_path
    etcd_address = _host_port(etcd_endpoint)
    bin_dir = _install_bin(base_dir, bin_cache)

    # Every `{{ *_port }}` placeholder of the template, plus the metrics port (an env variable).
    config = MilvusServerConfig(data_dir=str(base_dir))
    port_keys = sorted(k for k in config.configurable_items if k.endswith("_port"))
    *chosen, metrics_port = free_ports(len(port_keys) + 1)
    ports = dict(zip(port_keys, chosen, strict=True))
    config.update(**ports)  # resolve() binds each of them once to check, then writes the yaml
    rocksmq_path = base_dir / "data" / "rocksmq"  # what the wheel's resolve_storage() sets
    yaml_settings: dict[str, str] = {
        "etcd.endpoints": etcd_address,
        "etcd.use.embed": "false",
        "etcd.rootPath": root_path,
        "mq.type": mq_type,
        "common.chanNamePrefix.cluster": chan_prefix,
        "common.gracefulStopTimeout": str(GRACEFUL_STOP_TIMEOUT_S),
    }
    yaml_settings.update({f"{component}.ip": LOOPBACK for component in _COMPONENTS})
    yaml_settings.update(settings or {})
    for key, value in yaml_settings.items():
        config.set(key, value)
    config.resolve()  # writes configs/milvus.yaml and configs/glog.conf

    env = {k: v for k, v in os.environ.items() if not _is_milvus_setting(k)}
    library_path = os.environ.get("LD_LIBRARY_PATH")
    env.update(
        {
            "DEPLOY_MODE": "STANDALONE",
            "METRICS_PORT": str(metrics_port),
            "MILVUS_RUN_DIR": str(base_dir / "run"),
            "LD_LIBRARY_PATH": f"{bin_dir}:{library_path}" if library_path else str(bin_dir),
            "ETCD_USE_EMBED": "false",
            "ETCD_ENDPOINTS": etcd_address,
            "ETCD_ROOTPATH": root_path,
            "MQ_TYPE": mq_type,
            "COMMON_CHANNAMEPREFIX_CLUSTER": chan_prefix,
            "COMMON_GRACEFULSTOPTIMEOUT": str(GRACEFUL_STOP_TIMEOUT_S),
        }
    )
    env.update({f"{component.upper()}_IP": LOOPBACK for component in _COMPONENTS})
    env.update({_env_name(key): value for key, value in (settings or {}).items()})
    if mq_type == "kafka":
        assert kafka_bootstrap, "kafka_bootstrap is required with mq_type='kafka'"
        env["KAFKA_BROKERLIST"] = kafka_bootstrap
    else:
        env["ROCKSMQ_PATH"] = str(rocksmq_path)

    proxy_port = ports["proxy_port"]
    tls = (settings or {}).get("common.security.tlsMode", "0") != "0"
    uri = f"{'https' if tls else 'http'}://{LOOPBACK}:{proxy_port}"
    source = MilvusSource(
        uri=uri,
        host=LOOPBACK,
        port=proxy_port,
        pid=0,
        etcd_endpoint=etcd_address,
        etcd_root_path=root_path,
        chan_prefix=chan_prefix,
        mq_type=mq_type,
        kafka_bootstrap=kafka_bootstrap if mq_type == "kafka" else None,
        rocksmq_path=rocksmq_path if mq_type == "rocksmq" else None,
        metrics_port=metrics_port,
        ports=dict(ports),
        base_dir=base_dir,
        log_path=base_dir / "milvus.log",
    )
    argv = [str(bin_dir / "milvus"), "run", "standalone"]
    what = f"milvus 2.3.5 standalone on {uri} ({mq_type}, etcd root {root_path!r})"
    return _Prepared(argv=argv, env=env, source=source, what=what, client=client)


@contextlib.contextmanager
def _serving(prepared: _Prepared, startup_timeout: float) -> Iterator[MilvusSource]:
    """Run a prepared instance until it serves; stop it (SIGTERM, then SIGKILL) at the end."""
    source, what = prepared.source, prepared.what
    log_path = source.log_path
    started: subprocess.Popen[bytes] | None = None
    try:
        with _running(
            prepared.argv,
            log_path=log_path,
            env=prepared.env,
            cwd=source.base_dir,
            grace=STOP_GRACE_S,
        ) as process:
            started = process
            wait_until(
                lambda: local_milvus.healthz(source.metrics_port),
                startup_timeout,
                f"{what}: /healthz on port {source.metrics_port}",
                process=process,
                log_paths=[log_path],
                interval=0.2,
            )
            wait_until(
                lambda: _lists_collections(source.uri, source.port, prepared.client),
                startup_timeout,
                f"{what}: list_collections",
                process=process,
                log_paths=[log_path],
                interval=0.2,
            )
            yield replace(source, pid=process.pid)
    finally:
        if started is not None:
            local_milvus.remove_outside_files(started.pid)
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"[harness] milvus pid {started.pid} exit code {started.returncode}\n")


PORT_ATTEMPTS = 3
PORT_TAKEN = "bind: address already in use"


@contextlib.contextmanager
def _serving_on_free_ports(
    prepare: Callable[[], _Prepared], startup_timeout: float
) -> Iterator[MilvusSource]:
    """``_serving`` of what ``prepare`` makes, prepared again on other ports when one of the
    chosen ports was taken by another process of the machine before Milvus bound it: found by
    the wheel's check of each port when it writes the configuration, or by Milvus itself,
    which then panics at start ("bind: address already in use")."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            prepared = prepare()
        except RuntimeError as exc:  # the wheel: "set proxy_port=..., but bind failed"
            if "bind failed" not in str(exc) or attempt == PORT_ATTEMPTS:
                raise
            continue
        log_path = prepared.source.log_path
        logged = log_path.stat().st_size if log_path.exists() else 0
        stack = contextlib.ExitStack()
        try:
            source = stack.enter_context(_serving(prepared, startup_timeout))
        except ServiceStartError:
            stack.close()
            with open(log_path, "rb") as log:
                log.seek(logged)
                taken = PORT_TAKEN.encode() in log.read()
            if not taken or attempt == PORT_ATTEMPTS:
                raise
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"[harness] a port was taken before milvus bound it: try {attempt + 1}\n")
            continue
        with stack:
            yield source
        return


class RestartableMilvus:
    """A Milvus 2.3.5 standalone that can be killed (``SIGKILL``, as a lost cluster) and started
    again on the same ports, data directory, etcd root and queue, so clients and the daemon's
    cluster settings keep pointing at it. A restart does not rewrite its configuration (the
    wheel's port check would fail on the dead server's ports still in TIME_WAIT; Milvus itself
    binds them with SO_REUSEADDR). Right after a kill, a start waits about 27 s for the dead
    instance's etcd sessions to expire."""

    def __init__(self, prepared: _Prepared, startup_timeout: float) -> None:
        self._prepared = prepared
        self._startup_timeout = startup_timeout
        self._stack: contextlib.ExitStack | None = None
        self.current: MilvusSource | None = None
        self.starts = 0

    @property
    def source(self) -> MilvusSource:
        """The instance's addresses (``pid`` is the running process's, 0 while it is down)."""
        return self.current or self._prepared.source

    @property
    def alive(self) -> bool:
        return self.current is not None

    def start(self) -> MilvusSource:
        assert self.current is None, f"{self._prepared.what} is running"
        stack = contextlib.ExitStack()
        try:
            self.current = stack.enter_context(_serving(self._prepared, self._startup_timeout))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self.starts += 1
        return self.current

    def kill(self) -> None:
        """``kill -9`` of the running instance (its data stays for the next start)."""
        assert self.current is not None, f"{self._prepared.what} is not running"
        os.kill(self.current.pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        stack, self._stack, self.current = self._stack, None, None
        if stack is not None:
            stack.close()


@contextlib.contextmanager
def restartable_milvus(
    workdir: Path,
    etcd_endpoint: str,
    *,
    kafka_bootstrap: str | None = None,
    root_path: str = DEFAULT_ROOT_PATH,
    startup_timeout: float = 180.0,
    bin_cache: Path | None = None,
    settings: Mapping[str, str] | None = None,
    client: Mapping[str, Any] | None = None,
) -> Iterator[RestartableMilvus]:
    """A started RestartableMilvus: WAL on the Kafka at ``kafka_bootstrap`` (which outlives a
    kill, as a real cluster's queue does), else in RocksMQ under its directory. Stopped at the
    end. ``settings`` and ``client`` as for milvus_source_rocksmq() (TLS files named there are
    read again at each start: a certificate rotation)."""
    prepared = _prepare_standalone(
        workdir,
        etcd_endpoint,
        mq_type="kafka" if kafka_bootstrap else "rocksmq",
        kafka_bootstrap=kafka_bootstrap,
        root_path=root_path,
        chan_prefix=None,
        bin_cache=bin_cache,
        settings=settings,
        client=client,
    )
    milvus = RestartableMilvus(prepared, startup_timeout)
    milvus.start()
    try:
        yield milvus
    finally:
        milvus.close()


@contextlib.contextmanager
def milvus_source(
    workdir: Path,
    etcd_endpoint: str,
    kafka_bootstrap: str,
    *,
    root_path: str = DEFAULT_ROOT_PATH,
    chan_prefix: str | None = None,
    startup_timeout: float = 120.0,
    bin_cache: Path | None = None,
    settings: Mapping[str, str] | None = None,
    client: Mapping[str, Any] | None = None,
) -> Iterator[MilvusSource]:
    """Milvus 2.3.5 standalone: metadata in the etcd at `etcd_endpoint` under `root_path`, WAL
    on the Kafka at `kafka_bootstrap` in topics named after `chan_prefix` (default: root_path).
    `bin_cache` is where the unpacked binary is kept (default ~/.cache/milvus-cdc-tests, or
    $MILVUS_CDC_TEST_CACHE); `settings` and `client` as for milvus_source_rocksmq()."""

    def prepare() -> _Prepared:
        return _prepare_standalone(
            workdir,
            etcd_endpoint,
            mq_type="kafka",
            kafka_bootstrap=kafka_bootstrap,
            root_path=root_path,
            chan_prefix=chan_prefix,
            bin_cache=bin_cache,
            settings=settings,
            client=client,
        )

    with _serving_on_free_ports(prepare, startup_timeout) as source:
        yield source


@contextlib.contextmanager
def milvus_source_rocksmq(
    workdir: Path,
    etcd_endpoint: str,
    *,
    root_path: str = DEFAULT_ROOT_PATH,
    chan_prefix: str | None = None,
    startup_timeout: float = 120.0,
    bin_cache: Path | None = None,
    settings: Mapping[str, str] | None = None,
    client: Mapping[str, Any] | None = None,
) -> Iterator[MilvusSource]:
    """As milvus_source(), with the WAL in RocksMQ at `<workdir>/data/rocksmq` (its metadata
    RocksDB beside it, `..._meta_kv`); the result's rocksmq_path names it."""

    def prepare() -> _Prepared:
        return _prepare_standalone(
            workdir,
            etcd_endpoint,
            mq_type="rocksmq",
            kafka_bootstrap=None,
            root_path=root_path,
            chan_prefix=chan_prefix,
            bin_cache=bin_cache,
            settings=settings,
            client=client,
        )

    with _serving_on_free_ports(prepare, startup_timeout) as source:
        yield source
