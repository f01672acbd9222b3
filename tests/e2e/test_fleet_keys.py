"""A fleet whose daemons do not all hold its secrets key (a real etcd, and a real MariaDB, as the
shared metastore; a Milvus 2.6 stream on the Kafka mock as the source; Milvus Lite as the
target, its password stored sealed):

two daemons with the fleet's key run two tasks; a daemon with another key ring and one with no
key at all join. Both say at start which key ids they lack, answer ``/readyz`` 503 with that
reason, take no task (not even when a good daemon stops and its task is free), fail or change
none, and the keyless one makes no key of its own. Every task stays Running on the good daemons
and rows keep arriving on the target.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness.daemon import Daemon
from harness.services import wait_until
from test_crash import count
from test_fleet import SharedStore, listing, owners
from test_streaming_source import Stream, wait_for_collection

from metastore.keyring import KeyRing

pytestmark = pytest.mark.e2e

LEASE = 3.0
CHECK = 0.5
PASSWORD = "fleet-target-Pa55-sealed"
NOT_READY = "is not ready: the metastore's secrets are encrypted with key(s)"


@pytest.fixture(params=["etcd", "mysql"])
def shared_store(request: pytest.FixtureRequest) -> SharedStore:
    return SharedStore(request.param, request)


def key_file(daemon: Daemon) -> Path:
    return Path(daemon.config["secrets"]["keyFile"])


def member(
    daemon_factory: Callable[..., Daemon],
    name: str,
    store: SharedStore,
    stream: Stream,
    etcd_service: Any,
    kafka_mock: Any,
    ring: KeyRing | None,
) -> Daemon:
    """A daemon of the fleet, launched; ``ring``: its key file (None: no key file at all)."""
    daemon = daemon_factory(
        name,
        **stream.config(etcd_service, kafka_mock),
        metaStoreConfig=store.config(),
        fleet={"leaseSeconds": LEASE, "checkSeconds": CHECK, "memberId": name},
    )
    if ring is not None:
        key_file(daemon).parent.mkdir(parents=True, exist_ok=True)
        key_file(daemon).write_text(ring.text())
        key_file(daemon).chmod(0o600)
    return daemon.launch()


def readiness(daemon: Daemon) -> tuple[int, dict[str, Any]]:
    status, body = daemon.get("/readyz")
    return status, json.loads(body)


def test_daemons_without_the_fleets_key_take_nothing_and_say_why(
    daemon_factory, shared_store, stream, etcd_service, kafka_mock, milvus_lite_service,
    target_client,
):  # fmt: skip
    fleet_ring = KeyRing((KeyRing.new_key(),))
    other_ring = KeyRing((KeyRing.new_key(),))
    (fleet_key,) = fleet_ring.ids

    def join(name: str, ring: KeyRing | None) -> Daemon:
        return member(daemon_factory, name, shared_store, stream, etcd_service, kafka_mock, ring)

    good = {name: join(name, fleet_ring) for name in ("a", "b")}
    for daemon in good.values():
        daemon.wait_ready()
    logs = ", ".join(str(d.log_path) for d in good.values())

    # two tasks, their target's password sealed with the fleet's key
    w = stream.writer
    collections = {61001 + i: f"keys_{i}_{uuid.uuid4().hex[:6]}" for i in range(2)}
    vchannels = {cid: stream.vchannels(cid, 2) for cid in collections}
    tasks: dict[str, str] = {}
    for name in collections.values():
        created = good["a"].call(
            "create",
            {
                "milvus_connect_param": {
                    "uri": milvus_lite_service.uri,
                    "username": "root",
                    "password": PASSWORD,
                },
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body
        tasks[created.data["task_id"]] = name

    def positioned() -> bool:
        for task_id in tasks:
            reply = good["a"].call("position", {"task_id": task_id})
            named = {p["channel_name"] for p in reply.data.get("positions") or []}
            if not {stream.pchannel(i) for i in range(stream.channels)} <= named:
                return False
        return True

    wait_until(positioned, 30, f"every task has a position on every channel; logs: {logs}")
    for cid, name in collections.items():
        w.create_collection(cid, name, vchannels[cid], partition_ids=[1])
    stream.tick_all()
    for name in collections.values():
        wait_for_collection(target_client, name)

    written = 0

    def write_batch(rows: int = 20) -> None:
        """Rows into every collection; the target must reach ``written`` rows in each."""
        nonlocal written
        for cid in collections:
            for i, vchannel in enumerate(vchannels[cid]):
                start = written + i * rows // 2
                w.insert(vchannel, cid, range(start, start + rows // 2))
        written += rows
        stream.tick_all()

    def arrived(why: str) -> None:
        for name in collections.values():
            wait_until(
                lambda name=name: count(target_client, name) == written,
                30,
                f"{written} rows of {name} on the target ({why}); logs: {logs}",
            )

    write_batch()
    arrived("two good daemons")
    wait_until(
        lambda: sorted(o or "" for o in owners(good["b"]).values()) == ["a", "b"],
        30,
        f"the two tasks spread over a and b; logs: {logs}",
    )

    # a daemon with another key ring, and one with no key at all, join
    wrong = {"c": join("c", other_ring), "d": join("d", None)}
    logs = ", ".join(str(d.log_path) for d in (*good.values(), *wrong.values()))
    for name, daemon in wrong.items():
        held = other_ring.ids[0] if name == "c" else "no key"

        def not_ready(daemon: Daemon = daemon) -> bool:
            assert daemon.process is not None and daemon.process.poll() is None, daemon.log_path
            try:  # started (503 "starting" until then), not ready
                return readiness(daemon)[1]["status"] == "not ready"
            except OSError:  # not listening yet
                return False

        wait_until(not_ready, 30, f"{name} answers, not ready; log: {daemon.log_path}")
        status, body = readiness(daemon)
        assert status == 503 and body["status"] == "not ready", body
        assert body["missing_keys"] == [fleet_key]
        assert f"encrypted with key(s) {fleet_key}" in body["reason"]
        assert f"(it holds {held})" in body["reason"]
    assert not key_file(wrong["d"]).exists(), "the keyless daemon made a key of its own"

    # the fleet goes on: rows keep arriving, every task Running on a or b, over many rounds
    for _ in range(3):
        write_batch()
        arrived("c and d joined")
        views = listing(wrong["c"])
        running = dict.fromkeys(tasks, ("Running", ""))
        assert {t: (v["state"], v["reason"]) for t, v in views.items()} == running
        assert sorted(v["owner"] or "" for v in views.values()) == ["a", "b"], views
        time.sleep(CHECK * 2)

    # a wrong daemon cannot add a key of its own to the store: it stores no new secret
    refused = wrong["c"].call(
        "create",
        {
            "milvus_connect_param": {
                "uri": milvus_lite_service.uri,
                "username": "root",
                "password": PASSWORD,
            },
            "collection_infos": [{"name": f"refused_{uuid.uuid4().hex[:6]}"}],
        },
    )
    assert refused.code == 503 and fleet_key in refused.message, refused.body
    assert len(listing(wrong["d"])) == len(tasks)

    # b stops: its task is free, and only a may take it (c and d are not counted in the share)
    good["b"].stop()
    wait_until(
        lambda: set(owners(good["a"]).values()) == {"a"},
        LEASE + 20,
        f"a runs both tasks once b stopped; logs: {logs}",
    )
    write_batch()
    arrived("b stopped")
    assert all(v["state"] == "Running" for v in listing(good["a"]).values())
    for daemon in wrong.values():
        assert readiness(daemon)[0] == 503

    store = shared_store.open()
    try:
        assert set(store.secret_key_ids()) == {fleet_key}
    finally:
        store.close()
    for name, daemon in wrong.items():
        text = daemon.log_text()
        said = [line for line in text.splitlines() if NOT_READY in line]
        assert len(said) == 1 and fleet_key in said[0], (name, said)
        assert "task taken by fleet member" not in text
        assert "did not exist: made it with a new key" not in text
        assert PASSWORD not in text
        assert fleet_ring.encoded_keys()[0] not in text
