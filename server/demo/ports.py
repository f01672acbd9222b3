"""Free ports for the servers the demo and the test harness start.

A port is chosen free, then handed to a server that binds it seconds later (Milvus 2.3 binds a
dozen at start, after its etcd). Two things can take it in between:

- the kernel, for the local port of any outgoing connection, when it lies in the ephemeral
  range: so ports are chosen below it (at or above ``LISTEN_PORTS_FROM``);
- another chooser, in this process or another (the test workers, a second demo), that finds the
  port still unbound: so every port handed out is written, under a lock, in a file all choosers
  on the machine share, and none is handed out again for ``GIVEN_FOR_S``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LISTEN_PORTS_FROM = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# long enough for a server started under load to bind what it was given (Milvus: about a minute)
GIVEN_FOR_S = 600.0
GIVEN_FILE_NAME = "milvus-cdc-ports-given"


def ephemeral_ports_start() -> int:
    """The first port of the kernel's ephemeral range (0 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def given_file() -> Path:
    """The file of ports handed out lately, shared by every chooser on this machine."""
    return Path(tempfile.gettempdir()) / GIVEN_FILE_NAME


@contextlib.contextmanager
def _recently_given() -> Iterator[dict[int, float]]:
    """The ports handed out in the last ``GIVEN_FOR_S`` (port -> when), locked against other
    choosers while the caller adds to it; written back after. Where the file cannot be used
    (a read-only temporary directory) an empty record: the ports are still checked free."""
    try:
        fd = os.open(given_file(), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+", encoding="ascii") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        now = time.time()
        given: dict[int, float] = {}
        for line in fh.read().splitlines():
            port, _, when = line.partition(" ")
            with contextlib.suppress(ValueError):
                if now - float(when) < GIVEN_FOR_S:
                    given[int(port)] = float(when)
        yield given
        fh.seek(0)
        fh.truncate()
        fh.write("".join(f"{port} {when:.3f}\n" for port, when in given.items()))


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on every interface (Milvus listens on all), held together
    while chosen, none handed out lately by any chooser on this machine. Random ones between
    ``LISTEN_PORTS_FROM`` and the ephemeral range where there is room; else the kernel's."""
    chooser = random.SystemRandom()  # never a seeded global state two processes share
    start = ephemeral_ports_start()
    room = range(LISTEN_PORTS_FROM, start) if start > LISTEN_PORTS_FROM else range(0)
    with _recently_given() as given:
        candidates = [
            port
            for port in chooser.sample(room, min(len(room), 4 * count + 64 + len(given)))
            if port not in given
        ]
        socks: list[socket.socket] = []
        try:
            for port in candidates:
                if len(socks) == count:
                    break
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind(("", port))
                except OSError:
                    sock.close()  # in use, or in TIME_WAIT
                    continue
                socks.append(sock)
            while len(socks) < count:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("", 0))
            ports = [sock.getsockname()[1] for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        now = time.time()
        given.update((port, now) for port in ports)
    return ports


def hold_port(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that keeps every other server and chooser off the
    port until it is closed (just before the server meant to have it starts); OSError if the
    port is in use. It listens: a bound socket alone would not stop a server that binds with
    SO_REUSEADDR (Go's and aiohttp's do)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        sock.bind((host, port))
        sock.listen(1)
    except OSError:
        sock.close()
        raise
    return sock
