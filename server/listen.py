"""The daemon's listening sockets, bound before anything else starts: the port is the daemon's
from its first moment (another process cannot take it while the start runs), and a port in use
stops the start before the metastore is opened."""

from __future__ import annotations

import socket

BACKLOG = 128  # aiohttp's own


def bind(host: str, port: int) -> list[socket.socket]:
    """A listening socket for every address ``host`` resolves to (as aiohttp's TCPSite binds
    them); SystemExit naming the address when one cannot be bound (none left open)."""
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sockets: list[socket.socket] = []
    addresses = []
    try:
        for family, kind, proto, _, address in found:
            if address in addresses:
                continue
            addresses.append(address)
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sockets
