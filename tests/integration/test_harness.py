"""The harness starts real services, and they answer."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from harness.services import mariadb_server

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def test_etcd_put_get(etcd_service) -> None:
    import etcd3

    client = etcd3.client(host=etcd_service.host, port=etcd_service.port, timeout=10)
    try:
        key = f"/harness-test/{_name('k')}"
        client.put(key, "hello")
        value, meta = client.get(key)
        assert value == b"hello"
        assert meta is not None
        assert meta.key == key.encode()
        assert client.delete(key)
        assert client.get(key) == (None, None)
    finally:
        client.close()


def test_mariadb_create_insert_select(mariadb_service) -> None:
    import pymysql

    conn = pymysql.connect(
        host=mariadb_service.host,
        port=mariadb_service.port,
        user=mariadb_service.user,
        password=mariadb_service.password,
        database=mariadb_service.database,
        connect_timeout=5,
    )
    table = _name("harness")
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, name VARCHAR(64))")
            cur.executemany(
                f"INSERT INTO `{table}` (id, name) VALUES (%s, %s)",
                [(1, "one"), (2, "two"), (3, "three")],
            )
            conn.commit()
            cur.execute(f"SELECT id, name FROM `{table}` ORDER BY id")
            assert cur.fetchall() == ((1, "one"), (2, "two"), (3, "three"))
            cur.execute(f"DROP TABLE `{table}`")
    finally:
        conn.close()
    assert mariadb_service.sqlalchemy_url == (
        f"mysql+pymysql://root:{mariadb_service.password}@127.0.0.1:{mariadb_service.port}"
        f"/{mariadb_service.database}"
    )


def test_a_mariadb_starting_leaves_another_servers_temporary_tables(
    mariadb_service, tmp_path
) -> None:
    """A starting mariadbd deletes every "#sql*" file in its tmpdir: each server the harness
    starts has a tmpdir of its own, or one starting in another test worker deletes a running
    server's temporary tables (a DESCRIBE then failed "Error on delete of
    '/tmp/#sql-temptable-...MAI'")."""
    import pymysql

    conn = pymysql.connect(
        host=mariadb_service.host,
        port=mariadb_service.port,
        user=mariadb_service.user,
        password=mariadb_service.password,
        connect_timeout=5,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@tmpdir")
            ((tmpdir,),) = cur.fetchall()
    finally:
        conn.close()
    canary = Path(tmpdir) / f"#sql-canary-{uuid.uuid4().hex}.MAI"  # a temporary table's file
    canary.write_bytes(b"")
    try:
        with mariadb_server(tmp_path / "second"):
            pass
        assert canary.exists(), f"the second server's start deleted {canary}"
    finally:
        canary.unlink(missing_ok=True)


def test_milvus_lite_collection_roundtrip(milvus_lite_service) -> None:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=milvus_lite_service.uri, timeout=10, dedicated=True)
    collection = _name("harness")
    try:
        client.create_collection(collection, dimension=4, primary_field_name="id", id_type="int")
        rows = [{"id": i, "vector": [float(i), 0.5, 0.25, 1.0]} for i in (1, 2, 3)]
        assert client.insert(collection, rows)["insert_count"] == 3
        got = client.query(collection, filter="id >= 0", output_fields=["id"])
        assert sorted(row["id"] for row in got) == [1, 2, 3]
        client.drop_collection(collection)
        assert collection not in client.list_collections()
    finally:
        client.close()


@pytest.mark.parametrize("server", ["milvus_source_rocksmq", "milvus_lite_service"])
def test_what_a_test_creates_on_a_shared_milvus_is_dropped_when_it_ends(request, server) -> None:
    """harness/collection_sweep.py: collections (aliased ones too) and databases made during
    a test go; what was there before stays."""
    from harness.collection_sweep import Server, snapshot, sweeping
    from pymilvus import MilvusClient

    uri = request.getfixturevalue(server).uri
    client, shared = MilvusClient(uri=uri, dedicated=True), Server(uri)
    try:
        kept = _name("kept")
        client.create_collection(kept, dimension=4)
        made, aliased = _name("made"), _name("aliased")
        databases = server != "milvus_lite_service"  # Milvus Lite has the default one only
        database = _name("db")
        with sweeping(lambda: [uri]):
            client.create_collection(made, dimension=4)
            client.create_collection(aliased, dimension=4)
            client.create_alias(aliased, _name("alias"))
            if databases:
                client.create_database(database)
                shared.client(database).create_collection(made, dimension=4)
            during = snapshot(shared)
            assert {made, aliased, kept} <= during["default"]
            assert not databases or during[database] == {made}
        after = snapshot(shared)
        assert kept in after["default"] and not {made, aliased} & after["default"]
        assert database not in after
        client.drop_collection(kept)
    finally:
        client.close()
        shared.close()


def test_a_milvus_whose_port_was_taken_before_it_bound_starts_on_other_ports(
    etcd_service, tmp_path, monkeypatch
) -> None:
    """Milvus 2.3 panics at start when one of its ports is taken between the harness's choice
    and its bind (seen once in a full run: "bind: address already in use"); the harness then
    prepares it again on other ports."""
    import socket

    from harness import milvus_source as module
    from pymilvus import MilvusClient

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tried: list[dict[str, int]] = []
    real = module._serving

    def first_port_taken(prepared, startup_timeout):
        if not tried:  # another process binds a port after the choice, before Milvus does
            squatter.bind(("", prepared.source.ports["data_coord_port"]))
            squatter.listen()
        tried.append(dict(prepared.source.ports))
        return real(prepared, startup_timeout)

    monkeypatch.setattr(module, "_serving", first_port_taken)
    root = f"taken-{uuid.uuid4().hex[:8]}"
    try:
        with module.milvus_source_rocksmq(
            tmp_path / "milvus", etcd_service.endpoint, root_path=root
        ) as src:
            client = MilvusClient(uri=src.uri, timeout=30, dedicated=True)
            try:
                assert client.list_collections() == []
            finally:
                client.close()
            assert src.ports == tried[-1]
    finally:
        squatter.close()
    assert len(tried) == 2, tried
    assert tried[0] != tried[1]
    log = (tmp_path / "milvus" / "milvus.log").read_text()
    assert module.PORT_TAKEN in log
    assert "[harness] a port was taken before milvus bound it: try 2" in log
