"""Where streaming restarts after a backfill, with a real upsert's records.

Milvus 2.3.5 writes an upsert as an Insert whose ``MsgBase`` timestamp is 0 (its rows carry the
upsert's timestamp) and then a Delete of the same key with that timestamp. A stream that starts
between the two replays the Delete alone, after the backfill copied the upserted row: the row is
deleted from the target and stays missing. (The hand-over once read the Insert's time from its
``MsgBase`` alone, took it for older than the Delete, and so started between them; a boundary
backfill run lost the row of an upsert made as the task was created.)

The records are the real source's own, read from its Kafka channel and parsed here with
pymilvus's protobuf classes, not the daemon's decoder.
"""

from __future__ import annotations

import time
import uuid

import pytest
from pymilvus.grpc_gen import common_pb2, msg_pb2

from metastore import Position
from replicator.backfill.handover import group_start
from replicator.config.connections import EtcdSettings
from replicator.config.stores import etcd_client_for
from replicator.events import RawRecord
from replicator.meta.catalog import CollectionMeta, SourceCatalog
from replicator.sources.kafka import KafkaSource
from tests.e2e.test_replication import create_source_collection, make_rows

pytestmark = pytest.mark.e2e


def collection_meta(milvus_source, etcd_service, name: str) -> CollectionMeta:
    etcd = etcd_client_for(EtcdSettings(address=[etcd_service.endpoint]))
    catalog = SourceCatalog(etcd, milvus_source.etcd_root_path)
    (meta,) = [m for m in catalog.collections().values() if m.name == name]
    return meta


def records_since_creation(kafka: KafkaSource, meta: CollectionMeta, pchannel: str) -> list:
    """Every record of ``pchannel`` from the collection's CreateCollection to the end."""
    offset = kafka.offset_of(meta.start_positions[pchannel])
    before = kafka.position_before(offset)
    latest = kafka.watermarks(pchannel)[1]
    reader = kafka.open_channel(
        pchannel, Position("kafka", pchannel, before, 0) if before else None
    )
    records: list[RawRecord] = []
    deadline = time.monotonic() + 30
    try:
        while (not records or records[-1].offset < latest - 1) and time.monotonic() < deadline:
            records += reader.read_batch(500, 1.0)
    finally:
        reader.close()
    return records


def msg_type(record: RawRecord) -> int:
    return msg_pb2.TimeTickMsg.FromString(record.payload).base.msg_type  # field 1 of every one


def dml_of(record: RawRecord, collection_id: int) -> bool:
    """An Insert or a Delete of the collection."""
    kind = {common_pb2.Insert: msg_pb2.InsertRequest, common_pb2.Delete: msg_pb2.DeleteRequest}
    request = kind.get(msg_type(record))
    return request is not None and request.FromString(record.payload).collectionID == collection_id


def test_a_start_between_a_real_upserts_halves_moves_before_its_insert(
    milvus_source, etcd_service, kafka_mock, source_client
):
    name = f"handover_{uuid.uuid4().hex[:8]}"
    create_source_collection(source_client, name)
    source_client.insert(name, make_rows(0, 3, "old"))
    source_client.upsert(name, make_rows(1, 1, "new"))
    meta = collection_meta(milvus_source, etcd_service, name)
    kafka = KafkaSource(kafka_mock.bootstrap)

    # the collection's DML on the channels its keys went to: one Delete, the upsert's
    found = []
    for pchannel in meta.pchannels:
        records = records_since_creation(kafka, meta, pchannel)
        dml = [r for r in records if dml_of(r, meta.collection_id)]
        deletes = [i for i, r in enumerate(dml) if msg_type(r) == common_pb2.Delete]
        found += [(pchannel, dml, i) for i in deletes]
    assert len(found) == 1, f"one Delete (the upsert's) expected, found {len(found)}"
    pchannel, dml, at = found[0]
    assert at >= 1 and msg_type(dml[at - 1]) == common_pb2.Insert, "the Insert comes first"
    insert_record, delete_record = dml[at - 1], dml[at]
    insert = msg_pb2.InsertRequest.FromString(insert_record.payload)
    delete = msg_pb2.DeleteRequest.FromString(delete_record.payload)
    upserted_at = delete.base.timestamp
    assert list(delete.primary_keys.int_id.data) == [1]
    assert set(insert.timestamps) == {upserted_at}, "the Insert's rows have the upsert's time"
    # the fact the hand-over must not trip on (if Milvus sets it, the test still checks the move)
    print(f"the upsert's Insert: MsgBase timestamp {insert.base.timestamp}, rows {upserted_at}")
    assert insert.base.timestamp in (0, upserted_at)

    # reading would begin at the Delete: moved back to the Insert or before it
    between = Position("kafka", pchannel, insert_record.msg_id, upserted_at)
    moved = group_start(kafka, between)
    assert moved != between
    assert kafka.offset_of(moved.msg_id) + 1 <= insert_record.offset, (moved, insert_record)
    assert moved.ts == between.ts  # the saved time is kept: no regression for the metastore

    # reading would begin after the Delete: nothing to move
    after = Position("kafka", pchannel, delete_record.msg_id, upserted_at)
    assert group_start(kafka, after) == after
