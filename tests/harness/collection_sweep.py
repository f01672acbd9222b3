"""Drops what a test created on the session's shared Milvus servers once it ends.

A Milvus 2.3.5 standalone spends CPU on every collection it holds, loaded or not: each one's
flow graphs take every time tick of its channels, five a second. Measured with the harness
(one standalone on the Kafka mock, 40 s each): 3.1% of a core empty, 13.8% with 20 collections
(the Kafka mock 2.9% more), 4.0% once they were dropped. The session's servers gathered about a
hundred collections over a run, so later tests ran on a machine that the servers' idle work
kept busy. Tests name their collections uniquely and never read another test's, so what a test
created is dropped at its end, after its daemons stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from pymilvus import MilvusClient

log = logging.getLogger(__name__)

DEFAULT_DB = "default"
TIMEOUT_S = 20.0

Snapshot = dict[str, set[str]]  # database -> its collections


class Server:
    """One Milvus server's clients, one per database (2.3.5 has no DescribeDatabase, on which
    pymilvus's use_database relies, so a client is bound to its database when made)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._clients: dict[str, MilvusClient] = {}

    def client(self, database: str = DEFAULT_DB) -> MilvusClient:
        if database not in self._clients:
            self._clients[database] = MilvusClient(
                uri=self.uri, db_name=database, dedicated=True, timeout=TIMEOUT_S
            )
        return self._clients[database]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def snapshot(server: Server) -> Snapshot:
    """Every database's collections (Milvus Lite has only the default database)."""
    try:
        databases = server.client().list_databases(timeout=TIMEOUT_S)
    except Exception:  # noqa: BLE001  (a server without databases: the default one only)
        databases = [DEFAULT_DB]
    return {db: set(server.client(db).list_collections(timeout=TIMEOUT_S)) for db in databases}


def drop_created(server: Server, before: Snapshot) -> list[str]:
    """Drops every collection (its aliases too: 2.3 refuses to drop an aliased collection) and
    database not in ``before``; returns ``database.collection`` of each dropped collection."""
    dropped: list[str] = []
    now = snapshot(server)
    for database, collections in now.items():
        client = server.client(database)
        for name in sorted(collections - before.get(database, set())):
            try:
                client.drop_collection(name, timeout=TIMEOUT_S)
            except Exception:  # noqa: BLE001  (2.3 refuses while the collection has aliases)
                for alias in client.list_aliases(name, timeout=TIMEOUT_S).get("aliases", ()):
                    client.drop_alias(alias, timeout=TIMEOUT_S)
                client.drop_collection(name, timeout=TIMEOUT_S)
            dropped.append(f"{database}.{name}")
    for database in sorted(set(now) - set(before) - {DEFAULT_DB}):
        server.client().drop_database(database, timeout=TIMEOUT_S)
    return dropped


@contextmanager
def sweeping(uris: Callable[[], Iterable[str]]) -> Iterator[None]:
    """Around one test: what it leaves on the servers ``uris()`` names is dropped when it ends
    (a server started during the test held nothing before it). A server the test stopped or
    broke is left as it is, with a line in the log: the test's own outcome says what went
    wrong."""
    servers: dict[str, Server] = {}

    def server_at(uri: str) -> Server:
        return servers.setdefault(uri, Server(uri))

    try:
        before = {uri: snapshot(server_at(uri)) for uri in uris()}
        yield
        for uri in uris():
            try:
                drop_created(server_at(uri), before.get(uri, {DEFAULT_DB: set()}))
            except Exception as exc:  # noqa: BLE001  (see the docstring)
                log.warning("left what the test created on %s: %s", uri, exc)
    finally:
        for server in servers.values():
            server.close()
