"""A Kafka target whose task runs its channels in child processes (``kafkaTargetProcesses``,
replicator/pipeline/group_runner.py): a real Milvus 2.3.5 source, a collection of two shards
(its two pchannels fall in different groups), a writer inserting, upserting and deleting while
the daemon is killed (SIGKILL), one group's process is killed, and the daemon starts again
with another number of processes (2 -> 3 -> 1). A consumer rebuilds the source from the topic
row by row; every write is one event, none missing, none repeated; each key's events are in
source order; the collection's and the partition's creation, read by channels of both groups,
are one event each.

The accounting of the Kafka mock's missing read isolation is the one of test_kafka_sink.py.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from harness.process_tree import children_by_parent
from harness.services import wait_until
from pymilvus import MilvusClient
from test_backfill import Writer, task_view
from test_kafka_sink import Rebuilt, TrackedWrites, create_collection, make_rows, wait_rebuilt
from test_replication import rows, source_config

pytestmark = pytest.mark.e2e


def group_processes(daemon_pid: int) -> list[int]:
    """The daemon's channel group processes: the children of its fork server (multiprocessing's,
    a child of the daemon), which forks them."""
    children = children_by_parent()

    def command(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # ended meanwhile
            return b""

    servers = [
        pid for pid in children.get(daemon_pid, []) if b"multiprocessing.forkserver" in command(pid)
    ]
    return sorted(child for server in servers for child in children.get(server, []))


def test_channel_groups_exactly_once_through_kills_and_a_changed_layout(
    daemon_factory, milvus_source, etcd_service, kafka_mock
):
    name = f"kgroups_{uuid.uuid4().hex[:8]}"
    topic = f"events_{name}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    try:
        config = source_config(milvus_source, etcd_service, kafka_mock)
        daemon = daemon_factory(**config, kafkaTargetProcesses=2).start()
        created = daemon.call(
            "create",
            {
                "kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic},
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body

        def running_groups(count: int) -> list[int]:
            return wait_until(
                lambda: p if len(p := group_processes(daemon.process.pid)) == count else None,
                60,
                f"{count} group processes",
            )

        task_id = created.data["task_id"]
        running_groups(2)

        wait_until(
            lambda: daemon.log_path.read_text().count(" ready, ") >= 2,
            60,
            "both groups' producers ready (their models read)",
        )
        # made while the groups run: each group reads the CreateCollection on its channel (two
        # shards: a pchannel in each group) with a model that has no such collection yet
        create_collection(source, name)
        source.insert(name, make_rows(list(range(-100, 0)), "before"))
        writes = TrackedWrites(name)
        writer = Writer(milvus_source.uri, writes)
        writer.start()

        def groups_replicate(since: int) -> int:
            """Wait until the task's groups (only they report: the daemon reads no channel)
            applied rows past source time ``since`` on two channels; that time."""

            def moved() -> int | None:
                progress = task_view(daemon, task_id)["progress"] or {}
                times = [c["applied_ts"] for c in progress.get("channels", []) if c["rows"]]
                return min(times) if len(times) >= 2 and min(times) > since else None

            return wait_until(moved, 60, "rows replicated by the channel groups")

        applied = groups_replicate(0)
        orphans = group_processes(daemon.process.pid)
        daemon.kill()  # the daemon: its groups see their pipe close and exit
        wait_until(
            lambda: not any(Path(f"/proc/{pid}").exists() for pid in orphans),
            20,
            "the killed daemon's group processes to exit",
        )
        daemon.start()
        child = running_groups(2)[1]
        applied = groups_replicate(applied)
        os.kill(child, signal.SIGKILL)  # one group: the others stop, all start again
        wait_until(
            lambda: child not in (p := group_processes(daemon.process.pid)) and len(p) == 2,
            60,
            "the groups started again after one was killed",
        )
        applied = groups_replicate(applied)
        daemon.kill()
        daemon.config["kafkaTargetProcesses"] = 3  # another layout: the old producers fenced
        daemon.start()
        running_groups(3)
        groups_replicate(applied)
        daemon.stop()
        daemon.config["kafkaTargetProcesses"] = 1  # in the daemon again
        daemon.start()
        time.sleep(2.0)
        assert group_processes(daemon.process.pid) == []
        writer.finish()
        expected = rows(source, name, "id")

        rebuilt = wait_rebuilt(kafka_mock.bootstrap, topic, task_id, expected, daemon)
        row_events = rebuilt.row_events()
        channels = {e["source"]["channel"] for e in row_events}
        assert len(channels) == 2, channels  # both groups wrote rows
        pairs = Counter((e["pk"], e["ts"]["hybrid"]) for e in row_events)
        repeated = {pair: n for pair, n in pairs.items() if n > 1}
        if repeated:
            rebuilt.explain(f"events repeated: {list(repeated.items())[:10]}", len(repeated))
        per_key = Counter(e["pk"] for e in row_events if e["pk"] >= 0)
        differ = sorted(
            {(k, per_key[k], writes.ops[k]) for k in per_key | writes.ops}
            - {(k, n, n) for k, n in writes.ops.items()}
        )
        if differ:
            rebuilt.explain(f"(key, events, writes) that differ: {differ[:10]}", len(differ))
        # each key's events (one channel's, one partition of the topic) in source order
        times: dict[object, list[int]] = defaultdict(list)
        for event in row_events:
            times[event["pk"]].append(event["ts"]["hybrid"])
        unordered = [k for k, ts in times.items() if ts != sorted(ts)]
        assert not unordered, unordered[:10]
        ddl = Counter((e["op"], e.get("partition")) for e in rebuilt.ddl)
        assert ddl[("create_collection", None)] == 1, rebuilt.ddl
        assert ddl[("create_partition", "p1")] == 1, rebuilt.ddl
        if rebuilt.unequal:
            rebuilt.explain("transactions not whole", rebuilt.cut_off)
        # the drop, read on both groups' channels, applied once its last copy is read (the
        # barrier: both groups' arrivals in the task's state, under the groups' DDL lock)
        daemon.config["kafkaTargetProcesses"] = 2
        daemon.stop()
        daemon.start()
        running_groups(2)
        source.drop_collection(name)

        def drops() -> int | None:
            ddl = Rebuilt(kafka_mock.bootstrap, topic, task_id).ddl
            return sum(1 for e in ddl if e["op"] == "drop_collection") or None

        wait_until(drops, 60, "the drop as an event")
        time.sleep(3.0)
        assert drops() == 1
        print(
            f"kafka groups: {writer.rounds} write rounds, {len(expected)} rows, "
            f"{len(row_events)} row events; {rebuilt.account()}"
        )
    finally:
        source.close()


def test_a_groups_failure_fails_the_task_with_its_reason(
    daemon_factory, milvus_source, etcd_service, kafka_mock
):
    """A collection made before the task: both groups find it at start and ask the task's
    target (in the daemon) to make it, one at a time; its creation event is larger than the
    task's max_event_bytes, so the target refuses it, the group that asked first stops with
    that reason, and the task fails with it, as in one process (the other group, asking next,
    must not fail it with "already exists")."""
    name = f"kgfail_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    try:
        create_collection(source, name)
        source.insert(name, make_rows(list(range(5)), "big"))
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        created = daemon.call(
            "create",
            {
                "kafka_connect_param": {
                    "address": kafka_mock.bootstrap,
                    "topic": f"events_{name}",
                    "processes": 2,
                    "max_event_bytes": 60,
                },
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body
        task_id = created.data["task_id"]
        task = wait_until(
            lambda: t if (t := task_view(daemon, task_id))["state"] == "Failed" else None,
            60,
            "the task failed by its group",
        )
        assert "max_event_bytes (60)" in task["reason"], task["reason"]
        assert f"{name} pk " in task["reason"], task["reason"]
        log = daemon.log_path.read_text()
        assert "channels in 2 processes" in log
        assert "already exists" not in log  # the collection made once, by one group
        assert group_processes(daemon.process.pid) == []  # the groups ended with the task
        print(f"kafka groups, the task's reason: {task['reason']}")
    finally:
        source.close()
