"""A TCP listener that accepts connections and never answers: a source, queue or store that
hangs (a stuck server, a firewall that drops replies) rather than refusing."""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class BlackHole:
    """Listens on a free loopback port; every connection is accepted, read and never answered,
    until ``close``."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._closed = threading.Event()
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, name="blackhole", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(0.2)
            self._conns.append(conn)
            self.accepted += 1
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for conn in self._conns:
            conn.close()
        self._thread.join(timeout=2)

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
