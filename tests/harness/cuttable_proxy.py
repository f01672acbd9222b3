"""A TCP forwarder that can be cut like a network link: while cut, no byte passes either way
and new connections hang (nothing is refused or reset, as in a partition); healed, the bytes
held back flow again. Redirected, it stands for another server put behind the same address."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType


class CuttableProxy:
    """Listens on a free loopback port (or ``port``) and forwards every connection to
    ``upstream``."""

    def __init__(self, upstream_host: str, upstream_port: int, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._server = socket.create_server(("127.0.0.1", port))
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def redirect(self, upstream_host: str, upstream_port: int) -> None:
        """Another server behind the same address: every open connection is closed (as a
        server going away closes them), new ones go to ``upstream``."""
        self.upstream = (upstream_host, upstream_port)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._flowing.wait()  # a connection made while cut hangs until healed
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, upstream]
        peers = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                if not self._flowing.wait(0.2):
                    continue
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                for sock in ready:
                    if not self._flowing.is_set():
                        break  # cut between select and read: hold the bytes back
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):  # closed under us (close(), or the peer went)
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
