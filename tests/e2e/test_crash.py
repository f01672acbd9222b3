"""Crash safety: the daemon is killed with SIGKILL ten times at random moments while the source
takes a steady stream of inserts, upserts and deletes; afterwards the target equals the source
row by row and holds no duplicate primary key."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
from harness.services import ServiceStartError, wait_until
from pymilvus import MilvusClient
from test_replication import (
    create_source_collection,
    create_task,
    make_rows,
    rows,
    shared_everywhere,
    source_config,
)

pytestmark = pytest.mark.e2e

KILLS = 10


def count(client: MilvusClient, collection: str) -> int:
    client.load_collection(collection)
    result = client.query(
        collection, filter="", output_fields=["count(*)"], consistency_level="Strong"
    )
    return int(result[0]["count(*)"])


class SteadyWriter(threading.Thread):
    """Batches of inserts, with upserts of earlier rows and deletes mixed in."""

    def __init__(self, uri: str, collection: str) -> None:
        super().__init__(daemon=True)
        self.uri, self.collection = uri, collection
        self.stop = threading.Event()
        self.batches = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        client = MilvusClient(uri=self.uri, dedicated=True)
        rnd = random.Random(7)
        next_id = 0
        try:
            while not self.stop.is_set():
                client.insert(self.collection, make_rows(next_id, 50, f"b{self.batches}"))
                next_id += 50
                if self.batches % 3 == 2:
                    ids = rnd.sample(range(next_id), 30)
                    client.upsert(
                        self.collection,
                        [
                            dict(r, title=f"up{self.batches}")
                            for r in make_rows(0, next_id, "")
                            if r["id"] in set(ids)
                        ],
                    )
                if self.batches % 5 == 4:
                    client.delete(self.collection, ids=rnd.sample(range(next_id), 20))
                self.batches += 1
                time.sleep(0.1)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            client.close()


def test_kill_nine_ten_times_under_load_loses_and_doubles_nothing(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_lite_service, steady_writers
):
    """Two tasks, each with its own collection, read the source's channels through the
    daemon's shared readers (each task at its own position after every restart)."""
    names = [f"crash_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    try:
        for name in names:
            create_source_collection(source, name, dynamic=False)

        daemon = daemon_factory(
            **source_config(milvus_source, etcd_service, kafka_mock), logLevel="DEBUG"
        ).start()
        task_ids = [create_task(daemon, milvus_lite_service.uri, name) for name in names]

        writers = [steady_writers(name) for name in names]
        rnd = random.Random(2024)
        for _ in range(KILLS):
            time.sleep(rnd.uniform(0.3, 2.5))
            daemon.kill()
            daemon.start()
        for writer in writers:
            writer.stop.set()
            writer.join(timeout=60)
            assert writer.error is None, writer.error
            assert writer.batches >= KILLS

        for name in names:
            expected = rows(source, name, "id")

            def equal(name: str = name, expected: dict = expected) -> bool:
                return target.has_collection(name) and rows(target, name, "id") == expected

            try:
                wait_until(equal, 120, f"target {name} equal to the source after {KILLS} kills")
            except ServiceStartError:
                actual = rows(target, name, "id") if target.has_collection(name) else {}
                missing = sorted(set(expected) - set(actual))
                extra = sorted(set(actual) - set(expected))
                changed = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
                pytest.fail(
                    f"{name} after {KILLS} kills: {len(missing)} missing {missing[:10]}, "
                    f"{len(extra)} extra {extra[:10]}, {len(changed)} changed {changed[:10]}; "
                    f"e.g. {[(expected[k], actual[k]) for k in changed[:1]]}; "
                    f"daemon log: {daemon.log_path}"
                )
            assert count(target, name) == len(expected)  # no doubled row hides behind a dedup
        for task_id in task_ids:
            task = daemon.call("get", {"task_id": task_id}).data["task"]
            assert task["state"] == "Running"
        # caught up, both tasks read every channel from its shared reader
        wait_until(
            lambda: all(shared_everywhere(daemon, task_id) for task_id in task_ids),
            60,
            "both tasks reading the shared readers",
        )
        assert daemon.starts == KILLS + 1
        batches = sum(w.batches for w in writers)
        print(f"crash test: 2 tasks, {batches} write batches, {KILLS} kills")
    finally:
        source.close()
        target.close()
