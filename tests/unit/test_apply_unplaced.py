"""A batch holding rows of a collection the task has no target for stops the task with a reason
naming it, before any row of the batch is written: such rows were once dropped with only a log
line (a 2.6 collection a channel group never learned, CHANGELOG)."""

from __future__ import annotations

import pytest
from pymilvus.grpc_gen import msg_pb2, schema_pb2

from replicator.errors import TaskFailedError
from replicator.events import Delete, Insert
from replicator.pipeline.apply import BatchApplier
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.selection import TaskSelection


def schema() -> schema_pb2.CollectionSchema:
    return schema_pb2.CollectionSchema(
        name="known",
        fields=[
            schema_pb2.FieldSchema(
                fieldID=100, name="id", data_type=schema_pb2.DataType.Int64, is_primary_key=True
            )
        ],
    )


def insert(collection_id: int, name: str, ts: int, rows: int) -> Insert:
    return Insert(
        ts=ts,
        collection_id=collection_id,
        db_name="default",
        collection_name=name,
        partition_name="_default",
        num_rows=rows,
        request=msg_pb2.InsertRequest(num_rows=rows),
    )


def delete(collection_id: int, name: str, ts: int) -> Delete:
    return Delete(
        ts=ts,
        collection_id=collection_id,
        db_name="default",
        collection_name=name,
        partition_name="",
        num_rows=1,
        request=msg_pb2.DeleteRequest(),
    )


def test_rows_of_a_collection_without_a_target_stop_the_task_before_anything_is_written():
    registry = CollectionRegistry(TaskSelection(frozenset({("default", "*")}), {}), "_default")
    assert registry.add(7, "default", "known", schema(), ("by-dml_0",)) is not None
    # the target is never reached: the known collection's rows come first in the batch, and
    # a write of them would fail on this None target with another error than the one expected
    applier = BatchApplier(None, registry.resolve)  # type: ignore[arg-type]
    batch = [
        insert(7, "known", 100, 3),
        insert(9, "orders", 101, 4),
        delete(9, "orders", 102),
        insert(8, "users", 103, 2),
    ]
    with pytest.raises(TaskFailedError) as stopped:
        applier.apply(batch)
    message = str(stopped.value)
    assert "default.orders (id 9): 5 row(s) at ts 101" in message, message
    assert "default.users (id 8): 2 row(s) at ts 103" in message, message
    assert "known" not in message.split(":", 1)[1].split(";")[0], message
    assert "not dropped" in message and "the task stops here" in message, message
    assert applier.stats.rows_inserted == 0 and applier.stats.collection_rows == {}
