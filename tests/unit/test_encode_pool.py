"""A Kafka target's row events encoded in worker processes (``encode_pool``): the same events,
byte for byte and in the same order, as encoding in the task's process; a dead worker makes the
insert encode in place and the next one start a new pool; an encoding error is raised in the
writer as it would be in place."""

from __future__ import annotations

import os
import signal
import time

import pytest
from pymilvus.grpc_gen import msg_pb2, schema_pb2

from replicator.errors import TargetRejectedError
from replicator.events import Delete, Insert
from replicator.sinks import encode_pool
from replicator.sinks.kafka_columns import insert_events
from tests.unit.test_kafka_columns import HYBRID, Log, columns

T = schema_pb2.DataType


def request(pks: list[int]) -> msg_pb2.InsertRequest:
    docs = [b'{"color":"red","n":%d}' % pk if pk % 2 else b"{}" for pk in pks]
    return msg_pb2.InsertRequest(fields_data=columns(pks, docs), num_rows=len(pks))


@pytest.fixture(scope="module")
def pool():
    started = encode_pool.EncodePool(1, min_rows=1)
    yield started
    started.close()


def test_events_from_the_pool_are_those_made_in_place(pool):
    requests = [request(list(range(lo, lo + 300))) for lo in (0, 300, 600)]
    in_place = Log()
    for n, req in enumerate(requests):
        insert_events(in_place, "t", "db1", "c", "p1", "id", req.fields_data, 300, HYBRID + n, {})
    futures = [
        pool.submit(req, "db1", "c", "p1", "id", 300, HYBRID + n) for n, req in enumerate(requests)
    ]
    pooled = Log()
    rows = [encode_pool.log_encoded(pooled, "t", encode_pool.encoded_rows(f)) for f in futures]
    assert rows == [300, 300, 300]
    assert pooled.flat() == in_place.flat()  # topic, key and body of every row, in order
    assert len(pooled.flat()) == 900


def test_an_encoding_error_is_raised_in_the_writer(pool):
    broken = request([1, 2, 3])
    broken.fields_data[0].scalars.long_data.data.append(4)  # a pk column one row too long
    with pytest.raises(TargetRejectedError) as in_place:
        insert_events(Log(), "t", "db1", "c", "p1", "id", broken.fields_data, 3, HYBRID, {})
    future = pool.submit(broken, "db1", "c", "p1", "id", 3, HYBRID)
    with pytest.raises(TargetRejectedError) as pooled:
        encode_pool.encoded_rows(future)
    assert str(pooled.value) == str(in_place.value)


def test_a_dead_worker_encodes_in_place_and_the_next_batch_gets_a_new_pool():
    encode_pool.configure(1)
    try:
        first = encode_pool.shared_pool()
        assert first is not None
        encode_pool.encoded_rows(first.submit(request([1]), "db1", "c", "", "id", 1, HYBRID))
        for pid in first.worker_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        future = first.submit(request([2]), "db1", "c", "", "id", 1, HYBRID)
        assert encode_pool.encoded_rows(future) is None  # the writer encodes it in place
        second = encode_pool.shared_pool()
        assert second is not None and second is not first
        encoded = encode_pool.encoded_rows(
            second.submit(request([3]), "db1", "c", "", "id", 1, HYBRID)
        )
        assert encoded is not None and encoded[0] == [b'["db1","c",3]']
    finally:
        encode_pool.configure(0)
    assert encode_pool.shared_pool() is None


def test_only_the_inserts_before_a_batchs_first_delete_may_go_to_the_pool():
    fields = {"collection_id": 1, "db_name": "", "collection_name": "c", "partition_name": ""}
    insert = Insert(ts=1, num_rows=1, request=request([1]), **fields)
    delete = Delete(ts=2, num_rows=1, request=msg_pb2.DeleteRequest(), **fields)
    assert encode_pool.unpaired([insert, insert, delete, insert], Delete) == 2
    assert encode_pool.unpaired([insert], Delete) == 1
    assert encode_pool.unpaired([delete, insert], Delete) == 0
