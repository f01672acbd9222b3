"""Start real services on free loopback ports for tests, and stop them by PID.

Each context manager starts one service under a working directory (its data and its log files
live there), waits until the service answers, yields a small frozen dataclass describing it and,
on exit, stops exactly the process it started: SIGTERM, a few seconds' grace, then SIGKILL.

Nothing here imports the project's own packages; pymysql and pymilvus are imported lazily so
that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from server.demo import local_milvus
from server.demo.ports import free_ports

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
MARIADB_PASSWORD = "cdc-test-pw"
MARIADB_DATABASE = "milvus_cdc_test"

# Linux limits a unix socket path to 108 bytes (including the NUL).
_MAX_UNIX_SOCKET_PATH = 100


class ServiceStartError(RuntimeError):
    """A service did not come up (its process died, or it never answered in time)."""


class MissingBinaryError(ServiceStartError):
    """The executable a service needs is not installed."""


# --------------------------------------------------------------------------------------------
# Descriptions of running services


@dataclass(frozen=True, kw_only=True)
class EtcdService:
    endpoint: str  # "http://127.0.0.1:PORT"
    host: str
    port: int
    pid: int
    log_path: Path
    peer_port: int = 0  # with ``port``: where etcd_server(ports=...) starts it again


@dataclass(frozen=True)
class ServerTls:
    """TLS for a server the harness starts: its certificate and key, and (mutual TLS) the CA
    its clients' certificates must chain to."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, kw_only=True)
class MariaDBService:
    host: str
    port: int
    user: str = "root"
    password: str
    database: str
    pid: int
    sqlalchemy_url: str  # "mysql+pymysql://root:PW@127.0.0.1:PORT/DB"
    go_dsn: str  # "root:PW@tcp(127.0.0.1:PORT)/DB?charset=utf8"
    unix_socket: Path
    log_path: Path


@dataclass(frozen=True, kw_only=True)
class MilvusLiteService:
    host: str
    port: int
    uri: str  # "http://127.0.0.1:PORT"
    pid: int
    log_path: Path


# --------------------------------------------------------------------------------------------
# Generic helpers


def free_port() -> int:
    """A TCP port free on every interface right now, handed out to no one else lately (see
    ``server.demo.ports``)."""
    return free_ports(1)[0]


def log_tail(path: Path, lines: int = 40, max_bytes: int = 16384) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _diagnostics(last_error: BaseException | None, log_paths: Iterable[Path]) -> str:
    parts: list[str] = []
    if last_error is not None:
        parts.append(f"last readiness error: {type(last_error).__name__}: {last_error}")
    for path in log_paths:
        tail = log_tail(path)
        parts.append(f"--- tail of {path} ---\n{tail if tail else '(empty or missing)'}")
    return ("\n" + "\n".join(parts)) if parts else ""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    log_paths: Sequence[Path] = (),
    interval: float = 0.1,
) -> T:
    """Call `predicate` until it returns a truthy value, and return that value.

    Exceptions raised by `predicate` count as "not yet". Raises ServiceStartError naming `what`,
    with the last error and the tail of each log in `log_paths`, when `timeout` seconds pass or
    when `process` (the service's child process) exits first.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        if process is not None and process.poll() is not None:
            raise ServiceStartError(
                f"{what}: process {process.pid} exited with code {process.returncode} "
                f"before it was ready" + _diagnostics(last_error, log_paths)
            )
        try:
            result = predicate()
        except Exception as exc:  # noqa: BLE001  (any probe failure means "not yet")
            last_error = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise ServiceStartError(
                f"{what}: not ready after {timeout:g} s" + _diagnostics(last_error, log_paths)
            )
        time.sleep(interval)


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Stop one child process by its PID: SIGTERM, wait `grace` seconds, then SIGKILL.

    Goes through the Popen object, so it never signals a PID that has already been reaped
    (and possibly reused by an unrelated process).
    """
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(timeout=30)


_SETPRIV = shutil.which("setpriv")


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the kernel SIGTERMs it if the test process dies without cleaning up
    (SIGKILL, OOM); start_new_session=True keeps terminal signals away from it, so nothing else
    would stop an orphaned service. util-linux's setpriv sets the signal and execs `argv` (same
    PID). Not a preexec_fn: that forces a real fork() of the test process, and with gRPC threads
    running there gRPC's at-fork handler aborted the child ("ev_epoll1_linux.cc: Check failed")
    before it could exec; without one, subprocess uses vfork and runs no code in the child."""
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]


@contextlib.contextmanager
def _running(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    grace: float = 5.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in a new session with stdout and stderr appended to `log_path`."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            die_with_parent(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop_process(process, grace)


def _find_binary(name: str, *candidates: str, package: str) -> str:
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise MissingBinaryError(
        f"{name} not found (looked at {', '.join(candidates) or 'nothing'} and PATH); "
        f"install the Debian package {package!r}"
    )


def _current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.create_connection((host, port), timeout=0.5):
        return True


# --------------------------------------------------------------------------------------------
# etcd

_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _etcd_healthy(endpoint: str) -> bool:
    try:
        response = _NO_PROXY_OPENER.open(f"{endpoint}/health", timeout=1)
    except urllib.error.HTTPError as exc:  # not healthy yet (503); closed, else it leaks
        exc.close()
        raise
    with response:
        body = json.loads(response.read().decode("utf-8"))
    return body.get("health") in ("true", True)


@contextlib.contextmanager
def etcd_server(
    workdir: Path,
    *,
    startup_timeout: float = 30.0,
    ports: tuple[int, int] | None = None,
    tls: ServerTls | None = None,
    plain_port: int | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[EtcdService]:
    """A single-member etcd on free loopback ports, data under `workdir`.

    `ports` (client, peer) restarts an etcd where a stopped one was, to test recovery.
    `tls`: its clients connect over TLS (``https://``), mutual TLS with a client CA; its
    health is then asked on a plain-HTTP metrics port of its own; ``plain_port``: it also
    listens for plain-HTTP clients there; ``extra_args``: more of etcd's flags.
    """
    etcd = _find_binary("etcd", "/usr/bin/etcd", package="etcd-server")
    workdir.mkdir(parents=True, exist_ok=True)
    client_port, peer_port = ports or free_ports(2)
    client_url = f"{'https' if tls else 'http'}://{LOOPBACK}:{client_port}"
    health_url = client_url
    peer_url = f"http://{LOOPBACK}:{peer_port}"
    log_path = workdir / "etcd.log"
    argv = [
        etcd,
        "--name",
        "t",
        "--data-dir",
        str(workdir / "data"),
        "--listen-client-urls",
        client_url + (f",http://{LOOPBACK}:{plain_port}" if plain_port else ""),
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        f"t={peer_url}",
    ]
    if tls is not None:
        health_url = f"http://{LOOPBACK}:{free_port()}"
        argv += ["--cert-file", str(tls.cert_file), "--key-file", str(tls.key_file)]
        argv += ["--listen-metrics-urls", health_url]
        if tls.client_ca_file is not None:
            argv += ["--client-cert-auth", "--trusted-ca-file", str(tls.client_ca_file)]
    argv += extra_args
    # etcd reads ETCD_* environment variables as flags (and Milvus-style settings such as
    # ETCD_ENDPOINTS would confuse it): start it without them, except the one etcd 3.4 needs
    # on arm64.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ETCD_") or k == "ETCD_UNSUPPORTED_ARCH"
    }
    with _running(argv, log_path=log_path, env=env) as process:
        wait_until(
            lambda: _etcd_healthy(health_url),
            startup_timeout,
            f"etcd on {client_url}",
            process=process,
            log_paths=[log_path],
        )
        yield EtcdService(
            endpoint=client_url,
            host=LOOPBACK,
            port=client_port,
            pid=process.pid,
            log_path=log_path,
            peer_port=peer_port,
        )


# --------------------------------------------------------------------------------------------
# MariaDB


@contextlib.contextmanager
def _socket_dir(workdir: Path) -> Iterator[Path]:
    """`workdir`, or a short temporary directory if a socket path under it would be too long."""
    if len(str(workdir / "mariadbd.sock")) <= _MAX_UNIX_SOCKET_PATH:
        yield workdir
        return
    short = Path(tempfile.mkdtemp(prefix="cdc-mdb-"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _unix_socket_accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        sock.connect(str(path))
        return True


def _mariadb_socket_ready(unix_socket: Path) -> bool:
    import pymysql

    # pymysql leaks its socket when a unix-socket connect fails (a ResourceWarning, which
    # filterwarnings=error turns into a test error): probe the socket ourselves first.
    _unix_socket_accepts(unix_socket)
    conn = pymysql.connect(
        unix_socket=str(unix_socket), user="root", password="", connect_timeout=2
    )
    conn.close()
    return True


def _mariadb_bootstrap(unix_socket: Path, password: str, database: str) -> None:
    """Give root a password for TCP logins and create the test database."""
    import pymysql

    conn = pymysql.connect(
        unix_socket=str(unix_socket), user="root", password="", connect_timeout=5
    )
    try:
        with conn.cursor() as cur:
            for host in ("127.0.0.1", "localhost"):
                cur.execute(
                    "CREATE USER IF NOT EXISTS 'root'@%s IDENTIFIED BY %s", (host, password)
                )
                cur.execute("ALTER USER 'root'@%s IDENTIFIED BY %s", (host, password))
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@%s WITH GRANT OPTION", (host,))
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS `{database}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
            )
            cur.execute("FLUSH PRIVILEGES")
        conn.commit()
    finally:
        conn.close()


def _mariadb_tcp_ready(port: int, password: str, database: str) -> bool:
    import pymysql

    conn = pymysql.connect(
        host=LOOPBACK,
        port=port,
        user="root",
        password=password,
        database=database,
        connect_timeout=2,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone() == (1,)
    finally:
        conn.close()


@contextlib.contextmanager
def mariadb_server(
    workdir: Path,
    *,
    password: str = MARIADB_PASSWORD,
    database: str = MARIADB_DATABASE,
    startup_timeout: float = 60.0,
    tls: ServerTls | None = None,
) -> Iterator[MariaDBService]:
    """A fresh MariaDB on a free loopback port, root password set, `database` created;
    `tls`: it offers TLS with that certificate (client certificates checked against its
    client CA for users that require one)."""
    mariadbd = _find_binary("mariadbd", "/usr/sbin/mariadbd", package="mariadb-server")
    install_db = _find_binary(
        "mariadb-install-db", "/usr/bin/mariadb-install-db", package="mariadb-server"
    )
    workdir.mkdir(parents=True, exist_ok=True)
    datadir = workdir / "data"
    os_user = _current_user()
    # a temporary directory of its own: a starting mariadbd deletes every "#sql*" file in its
    # tmpdir (its own leftovers, it assumes), which in a shared /tmp are the live temporary
    # tables of the other servers the test workers run ("Error on delete of
    # '/tmp/#sql-temptable-...MAI'" in a DESCRIBE, a CI run of 2026-12-07)
    tmpdir = workdir / "tmp"
    tmpdir.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmpdir)}

    install_log = workdir / "mariadb-install-db.log"
    with open(install_log, "ab") as log:
        try:
            result = subprocess.run(
                [
                    install_db,
                    "--no-defaults",
                    f"--user={os_user}",
                    f"--datadir={datadir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=False,
                env=env,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServiceStartError(
                "mariadb-install-db timed out" + _diagnostics(exc, [install_log])
            ) from exc
    if result.returncode != 0:
        raise ServiceStartError(
            f"mariadb-install-db exited with code {result.returncode}"
            + _diagnostics(None, [install_log])
        )

    port = free_port()
    error_log = workdir / "mariadbd.err"
    out_log = workdir / "mariadbd.out"
    logs = [error_log, out_log]
    with _socket_dir(workdir) as sock_dir:
        unix_socket = sock_dir / "mariadbd.sock"
        argv = [
            mariadbd,
            "--no-defaults",
            f"--user={os_user}",
            f"--datadir={datadir}",
            f"--socket={unix_socket}",
            f"--port={port}",
            f"--bind-address={LOOPBACK}",
            f"--pid-file={workdir / 'mariadbd.pid'}",
            f"--log-error={error_log}",
            f"--tmpdir={tmpdir}",
            "--innodb-buffer-pool-size=64M",
            "--skip-name-resolve",
        ]
        if tls is not None:
            argv += [f"--ssl-cert={tls.cert_file}", f"--ssl-key={tls.key_file}"]
            if tls.client_ca_file is not None:
                argv.append(f"--ssl-ca={tls.client_ca_file}")
        with _running(argv, log_path=out_log, env=env, grace=15.0) as process:
            what = f"mariadbd on {LOOPBACK}:{port}"
            wait_until(
                lambda: _mariadb_socket_ready(unix_socket),
                startup_timeout,
                f"{what} (unix socket {unix_socket})",
                process=process,
                log_paths=logs,
            )
            _mariadb_bootstrap(unix_socket, password, database)
            wait_until(
                lambda: _mariadb_tcp_ready(port, password, database),
                startup_timeout,
                f"{what} (TCP login as root)",
                process=process,
                log_paths=logs,
            )
            quoted = urllib.parse.quote(password, safe="")
            yield MariaDBService(
                host=LOOPBACK,
                port=port,
                user="root",
                password=password,
                database=database,
                pid=process.pid,
                sqlalchemy_url=f"mysql+pymysql://root:{quoted}@{LOOPBACK}:{port}/{database}",
                go_dsn=f"root:{password}@tcp({LOOPBACK}:{port})/{database}?charset=utf8",
                unix_socket=unix_socket,
                log_path=error_log,
            )


# --------------------------------------------------------------------------------------------
# Milvus Lite


def _milvus_lite_command() -> list[str]:
    """The milvus-lite console script of this interpreter's environment (else PATH's)."""
    try:
        return local_milvus.milvus_lite_command()
    except local_milvus.NotInstalledError as exc:
        raise MissingBinaryError(
            f"{exc}; install the Python test extras (pip install -e '.[test]')"
        ) from exc


def _milvus_lite_ready(uri: str, port: int) -> bool:
    if not _port_open(port):
        return False
    from pymilvus import MilvusClient

    # dedicated: a shared pymilvus 3 channel outlives close() and keeps pinging the server
    client = MilvusClient(uri=uri, timeout=2, dedicated=True)
    try:
        client.list_collections(timeout=2)
    finally:
        client.close()
    return True


@contextlib.contextmanager
def milvus_lite_server(
    workdir: Path, *, startup_timeout: float = 60.0, port: int | None = None
) -> Iterator[MilvusLiteService]:
    """A Milvus Lite gRPC server on a free loopback port (or `port`: a restart where it was),
    data under `workdir`. A free port taken by another process before the server bound it is
    replaced by another one (twice at most)."""
    command = _milvus_lite_command()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "milvus-lite.log"
    attempts = 1 if port else 3
    for attempt in range(attempts):
        chosen = port or free_port()
        uri = f"http://{LOOPBACK}:{chosen}"
        argv = [*command, "server", "--data-dir", str(workdir / "data")]
        argv += ["--host", LOOPBACK, "--port", str(chosen)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        stack = contextlib.ExitStack()
        try:
            process = stack.enter_context(_running(argv, log_path=log_path, env=env, cwd=workdir))
            wait_until(
                lambda: _milvus_lite_ready(uri, chosen),  # noqa: B023 - used in this iteration
                startup_timeout,
                f"milvus-lite on {uri}",
                process=process,
                log_paths=[log_path],
                interval=0.2,
            )
        except ServiceStartError as exc:
            stack.close()
            if attempt + 1 < attempts and "Address already in use" in str(exc):
                continue
            raise
        with stack:
            yield MilvusLiteService(
                host=LOOPBACK, port=chosen, uri=uri, pid=process.pid, log_path=log_path
            )
        return
