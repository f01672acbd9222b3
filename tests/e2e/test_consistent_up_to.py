"""What ``consistent_up_to`` claims of a task that has read its channels to their end: only the
time ticks it read prove anything. A write's time is given before it reaches the queue (a 2.3
proxy stamps, then produces; a 2.6 append takes its tick, then appends), so the moment a read
begins proves nothing about writes stamped before it (issue 41, bug 9).

And what a failover exports of a 2.6 WAL whose ticks are out of offset order: exactly the
records the target lacks. Shown on a 2.6 stream written into the Kafka mock
(tests/harness/streaming_writer.py), into Milvus Lite; the failover on a real Milvus 2.3.5 is in
test_disaster_recovery.py.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from harness.services import wait_until

from tests.e2e.test_replication import rows
from tests.e2e.test_streaming_source import start_task, task_view, wait_for_collection, wait_rows

pytestmark = pytest.mark.e2e

# longer than two of a quiet channel's longest idle reads (5 s, the worker's
# IDLE_READ_SECONDS_MAX): every channel has begun and ended a read to its end meanwhile,
# begun well after the write took its time
SLOW_APPEND_SECONDS = 12.0


def consistent_ts(daemon, task_id: str) -> int:
    moment = task_view(daemon, task_id)["progress"].get("consistent_up_to") or {}
    return int(moment.get("ts") or 0)


def replicating(
    daemon_factory,
    etcd_service,
    kafka_mock,
    target_uri: str,
    stream,
    collection_id: int,
    shards: int,
) -> tuple:
    """A daemon, a task of a new collection of ``shards`` vchannels and 10 rows per vchannel:
    (daemon, task id, collection name, vchannels, the rows it holds as key -> tag)."""
    name = f"c{collection_id}_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, target_uri, stream, name)
    vchannels = stream.vchannels(collection_id, shards)
    stream.writer.create_collection(collection_id, name, vchannels)
    for i, vchannel in enumerate(vchannels):
        stream.writer.insert(vchannel, collection_id, range(10 * i, 10 * i + 10))
    stream.tick_all()
    return daemon, task_id, name, vchannels, {pk: f"row-{pk}" for pk in range(10 * shards)}


def test_a_write_stamped_before_a_caught_up_read_is_not_claimed_until_it_is_applied(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """A write takes its time, then reaches the WAL 12 s later; meanwhile the task reads every
    channel to its end, again and again. Its ``consistent_up_to`` stays below the write's time
    (at the channels' last ticks) until the write is on the target, then passes it."""
    w, coll = stream.writer, 57001
    daemon, task_id, name, (v0, _), held = replicating(
        daemon_factory, etcd_service, kafka_mock, milvus_lite_service.uri, stream, coll, 2
    )
    last_tick = w.tso.next() - 1  # every channel's last tick is at or below it
    wait_for_collection(target_client, name)
    wait_rows(target_client, name, held)
    wait_until(lambda: consistent_ts(daemon, task_id), 30, "consistent_up_to known")

    stamped = w.tso.next()  # the write takes its time ...
    claims = []
    deadline = time.monotonic() + SLOW_APPEND_SECONDS
    while time.monotonic() < deadline:  # ... while the task reads to the end, caught up
        claims.append(consistent_ts(daemon, task_id))
        time.sleep(0.5)
    assert task_view(daemon, task_id)["progress"]["lag_seconds"] == 0, "not caught up"
    assert max(claims) < stamped, (max(claims) - stamped) / 2**18 / 1000
    assert max(claims) <= last_tick  # what the ticks prove, no more
    w.insert(v0, coll, range(20, 30), tt=stamped)  # ... and reaches the queue
    assert consistent_ts(daemon, task_id) < stamped  # read, not applied: no tick yet
    stream.tick_all()
    wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(30)})
    wait_until(
        lambda: consistent_ts(daemon, task_id) >= stamped, 30, "consistent_up_to past the write"
    )


def test_a_failover_exports_what_the_target_lacks_and_not_a_record_released_out_of_order(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """2.6 ticks are not monotonic in offset order: A (tick s2) is appended before B (s1 < s2),
    then a TimeTick t between them releases B, and A waits. The saved position is before A, so
    B follows it in the WAL but the target holds it (a resume skips it as a repeat). The
    failover exports A and not B, and claims t: the last tick, below A."""
    w, coll = stream.writer, 57002
    daemon, task_id, name, (v0,), held = replicating(
        daemon_factory, etcd_service, kafka_mock, milvus_lite_service.uri, stream, coll, 1
    )
    wait_for_collection(target_client, name)
    wait_rows(target_client, name, held)

    s1, t, s2 = w.tso.next(), w.tso.next(), w.tso.next()
    a = w.insert(v0, coll, range(100, 105), tt=s2)
    b = w.insert(v0, coll, range(200, 205), tt=s1)
    w.time_tick(stream.pchannel(0), tt=t)
    for other in (1, 2):  # the other pchannels tick past s2: only the first bounds the task
        w.time_tick(stream.pchannel(other))
    wait_rows(target_client, name, {**held, **{pk: f"row-{pk}" for pk in range(200, 205)}})

    status, _, answer = daemon.request("POST", f"/v1/tasks/{task_id}/failover", {})
    assert status == 200, answer
    assert answer["complete"] is True, answer
    lines = [json.loads(x) for x in Path(answer["unreplicated"]["file"]).read_text().splitlines()]
    assert sorted(line["pk"] for line in lines) == list(range(100, 105))
    assert {line["source"]["position"] for line in lines} == {a.offset}
    on_target = set(rows(target_client, name, "id"))
    assert not on_target & set(range(100, 105)) and set(range(200, 205)) <= on_target
    first = next(c for c in answer["unreplicated"]["channels"] if c["channel"] == a.pchannel)
    assert first["applied_after"] == 1 and first["records"] == 1, first  # b, and a
    assert b.offset > first["after_offset"]
    assert first["consistent_up_to"]["ts"] == t
    assert answer["consistent_up_to"]["ts"] == t
    assert answer["unapplied_from"]["ts"] == s2
