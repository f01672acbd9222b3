"""A Milvus 2.6 source's catalog in a real etcd: written by tests/harness/catalog26_writer.py the
way Milvus's kv_catalog.go and DDL ack callbacks write it (its own field numbers), read by
replicator/meta/catalog.py, compared field by field. Collections exist before any task, and
their start positions name their CreateCollection copies in the WAL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.descriptor_pb2 import FieldDescriptorProto
from harness.catalog26_writer import (
    IMPORT_COMPLETED,
    IMPORT_FAILED,
    IMPORT_IMPORTING,
    TOMBSTONE,
    Catalog26Writer,
    CreatedCollection,
)
from harness.streaming_protos import build_classes
from harness.streaming_writer import StreamingWriter, collection_schema
from pymilvus.grpc_gen import common_pb2, schema_pb2

from replicator.codec.streaming import decode_any
from replicator.codec.streaming_events import StreamCreateCollection
from replicator.meta import CatalogReader, SourceCatalog, is_streaming_source
from replicator.meta.imports import ImportPhase, SourceImport
from replicator.meta.segments import unserved
from replicator.sources.kafka import KafkaSource

pytestmark = pytest.mark.integration

PCHANNELS = ["by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"]


@pytest.fixture
def etcd(etcd_service: Any) -> Iterator[Any]:
    import etcd3

    client = etcd3.client(host=etcd_service.host, port=etcd_service.port, timeout=10)
    yield client
    client.close()


@pytest.fixture
def root() -> str:
    return f"cat26-{uuid.uuid4().hex[:8]}"


def _rich_schema(name: str) -> schema_pb2.CollectionSchema:
    """Dynamic, with a BM25 function and a struct-array field: what only 2.6 writes as keys."""
    schema = collection_schema(name, dim=4)
    schema.description = "pre-existing"
    schema.enable_dynamic_field = True
    text = schema.fields.add(fieldID=103, name="text", data_type=schema_pb2.VarChar)
    text.type_params.add(key="max_length", value="256")
    text.type_params.add(key="enable_analyzer", value="true")
    schema.fields.add(
        fieldID=104, name="sparse", data_type=schema_pb2.SparseFloatVector, is_function_output=True
    )
    schema.fields.add(fieldID=105, name="$meta", data_type=schema_pb2.JSON, is_dynamic=True)
    schema.functions.add(
        name="bm25",
        id=200,
        type=schema_pb2.FunctionType.BM25,
        input_field_names=["text"],
        input_field_ids=[103],
        output_field_names=["sparse"],
        output_field_ids=[104],
    )
    clips = schema.struct_array_fields.add(fieldID=110, name="clips", description="scenes")
    clip_vec = clips.fields.add(
        fieldID=111,
        name="clip_vec",
        data_type=schema_pb2.ArrayOfVector,
        element_type=schema_pb2.FloatVector,
    )
    clip_vec.type_params.add(key="dim", value="4")
    return schema


def _fields(schema: Any) -> dict[int, Any]:
    return {f.fieldID: f for f in schema.fields}


def _check(catalog: CatalogReader, made: CreatedCollection, db_name: str) -> None:
    meta = catalog.collections()[made.collection_id]
    assert (meta.name, meta.db_id, meta.db_name) == (made.name, made.db_id, db_name)
    assert not meta.dropped and meta.state == 0
    assert meta.vchannels == tuple(made.vchannels) and meta.pchannels == tuple(made.pchannels)
    assert meta.shards == len(made.pchannels)
    assert meta.consistency_level == made.consistency_level
    assert meta.properties == made.properties
    assert "consistency_level" not in meta.properties
    assert meta.create_time == meta.update_timestamp == made.create_time
    assert meta.partitions == made.partitions
    assert meta.start_positions == made.start_positions
    # the schema: every field key, system fields included, with its type and parameters
    assert _fields(meta.schema) == _fields(made.schema)
    assert [f.fieldID for f in meta.schema.fields] == sorted(_fields(made.schema))
    assert list(meta.schema.functions) == list(made.schema.functions)
    assert list(meta.schema.struct_array_fields) == list(made.schema.struct_array_fields)
    assert meta.schema.description == made.schema.description
    assert meta.schema.enable_dynamic_field == made.schema.enable_dynamic_field
    assert catalog.collection(made.collection_id) == meta


def test_catalog26_round_trip(etcd: Any, root: str) -> None:
    wal = StreamingWriter(None)  # records kept in memory: the same bytes Kafka would get
    writer = Catalog26Writer(etcd, root, tso=wal.tso)
    writer.register_pchannels(PCHANNELS)
    writer.create_database(7001, "books", properties={"database.replica.number": "1"})

    # one collection broadcast in the WAL before the task, one only in etcd
    shelved = writer.create_collection(
        4401,
        "shelved",
        PCHANNELS,
        schema=_rich_schema("shelved"),
        consistency_level=common_pb2.Session,
        properties={"timezone": "Asia/Shanghai", "collection.ttl.seconds": "3600"},
        wal=wal,
    )
    loans = writer.create_collection(
        4501,
        "loans",
        PCHANNELS[1:],
        db_id=7001,
        db_name="books",
        partitions={4502: "_default", 4503: "overdue"},
        consistency_level=common_pb2.Strong,
    )
    writer.create_partition(4401, 4410, "fiction")
    shelved.partitions[4410] = "fiction"
    writer.create_alias(1, "shelf", 4401)
    writer.create_alias(7001, "due", 4501)

    catalog = SourceCatalog(etcd, root)
    assert is_streaming_source(etcd, root)
    assert not is_streaming_source(etcd, f"{root}-none")
    assert catalog.databases() == {1: "default", 7001: "books"}
    assert sorted(catalog.collections()) == [4401, 4501]
    _check(catalog, shelved, "default")
    _check(catalog, loans, "books")
    assert loans.start_positions == {}  # never broadcast here: no position to start from
    assert catalog.collection(-1) is None
    assert {(a.name, a.db_id, a.collection_id) for a in catalog.aliases()} == {
        ("shelf", 1, 4401),
        ("due", 7001, 4501),
    }

    # alter alias: the same key rewritten to another collection
    writer.create_alias(1, "shelf", 4501)
    assert {a.name: a.collection_id for a in catalog.aliases()}["shelf"] == 4501

    # drops: partition and alias keys removed; a dropped collection is kept, marked dropping,
    # until its keys go (removed, or tombstoned as before 2.6)
    writer.drop_partition(4401, 4410)
    writer.drop_alias(7001, "due")
    writer.drop_collection(4501)
    dropped = catalog.collection(4501)
    assert dropped is not None and dropped.dropped and dropped.state == 2
    assert dropped.update_timestamp > dropped.create_time
    assert 4410 not in catalog.collections()[4401].partitions
    assert {a.name for a in catalog.aliases()} == {"shelf"}
    writer.drop_collection(4501, remove=True, tombstones=True)
    writer.drop_collection(4401, remove=True)
    writer.drop_database(7001, tombstones=True)
    assert catalog.collections() == {}
    assert catalog.collection(4401) is None and catalog.collection(4501) is None
    assert catalog.aliases() == []
    assert catalog.databases() == {1: "default"}


def test_start_positions_name_the_create_collection_copies(etcd: Any, root: str) -> None:
    """Where a task starts on a 2.6 WAL: a start position converts with the Kafka source's
    ``offset_of`` to the offset of the collection's CreateCollection copy on that pchannel;
    the first record of the collection there comes after it."""
    wal = StreamingWriter(None)
    writer = Catalog26Writer(etcd, root, tso=wal.tso)
    for pchannel in PCHANNELS:  # other traffic before the collection exists
        wal.time_tick(pchannel)
        wal.time_tick(pchannel)
    made = writer.create_collection(4601, "early", PCHANNELS, wal=wal)
    rows = wal.insert(made.vchannels[1], 4601, [1, 2, 3], partition_id=4602)

    meta = SourceCatalog(etcd, root).collection(4601)
    assert meta is not None
    by_offset = {(w.pchannel, w.offset): w for w in wal.written}
    for pchannel, vchannel in zip(made.pchannels, made.vchannels, strict=True):
        offset = KafkaSource.offset_of(meta.start_positions[pchannel])
        event = decode_any(by_offset[(pchannel, offset)].raw_record(), "kafka", lambda _: True)
        assert isinstance(event, StreamCreateCollection)
        assert event.collection_id == 4601 and event.meta.vchannel == vchannel
        assert offset == next(w.offset for w in made.written if w.pchannel == pchannel)
        assert offset >= 2  # after the ticks written before: a position, not the channel's start
    assert KafkaSource.offset_of(meta.start_positions[rows.pchannel]) < rows.offset


def test_older_layouts_beside_the_new(etcd: Any, root: str) -> None:
    """What a 2.6 catalog can still hold from the versions it was upgraded from
    (``kv_catalog.go`` reads them too): a collection key from before databases
    (``root-coord/collection/<id>``, default database) whose partitions are in the record
    (CollectionInfo 4 partitionIDs, 5 partitionNames, 9 their timestamps), and tombstones."""
    legacy = build_classes(
        "cdc_test.etcd_meta_legacy",
        {
            "CollectionInfo": [
                ("ID", 1, FieldDescriptorProto.TYPE_INT64, False, ""),
                ("schema", 2, FieldDescriptorProto.TYPE_BYTES, False, ""),
                ("partitionIDs", 4, FieldDescriptorProto.TYPE_INT64, True, ""),
                ("partitionNames", 5, FieldDescriptorProto.TYPE_STRING, True, ""),
                ("partition_created_timestamps", 9, FieldDescriptorProto.TYPE_UINT64, True, ""),
                ("physical_channel_names", 8, FieldDescriptorProto.TYPE_STRING, True, ""),
            ]
        },
        {},
    )["CollectionInfo"]
    schema = collection_schema("old")  # fields embedded in the record, as before 2.1
    info = legacy(
        ID=300,
        schema=schema.SerializeToString(),
        partitionIDs=[301, 302],
        partitionNames=["_default", "p1"],
        partition_created_timestamps=[5, 6],
        physical_channel_names=PCHANNELS[:1],
    )
    base = f"{root}/meta/root-coord"
    etcd.put(f"{base}/collection/300", info.SerializeToString())
    etcd.put(f"{base}/collection/301", TOMBSTONE)
    etcd.put(f"{base}/database/collection-info/1/302", TOMBSTONE)
    etcd.put(f"{base}/fields/302/100", TOMBSTONE)

    catalog = SourceCatalog(etcd, root)
    (meta,) = catalog.collections().values()
    assert (meta.collection_id, meta.db_id, meta.db_name) == (300, 1, "default")
    assert meta.partitions == {301: "_default", 302: "p1"}
    assert [f.name for f in meta.schema.fields] == ["id", "vector", "tag"]
    assert catalog.collection(300) == meta
    assert catalog.collection(301) is None and catalog.collection(302) is None
    assert not is_streaming_source(etcd, root)


def test_import_jobs_of_the_data_coordinator(etcd: Any, root: str) -> None:
    """2.4+ bulk imports: the import-job records written with the protobuf runtime from
    Milvus's field numbers, read by the catalog's hand decoder, through every state change."""
    writer = Catalog26Writer(etcd, root)
    writer.create_database(7001, "books")
    files = [["s3://bucket/a.parquet"], ["s3://bucket/b.parquet"]]
    writer.import_job(9001, 4401, "shelved", files, IMPORT_IMPORTING, db_id=7001)
    writer.import_job(9002, 4402, "loans", [["x.json"]], IMPORT_FAILED, reason="bad row 3")
    catalog = SourceCatalog(etcd, root)
    found = {i.job_id: i for i in catalog.imports()}
    assert found[9001] == SourceImport(
        job_id=9001,
        collection_id=4401,
        collection_name="shelved",
        phase=ImportPhase.RUNNING,
        files=("s3://bucket/a.parquet", "s3://bucket/b.parquet"),
        db_name="books",
        created="2026-11-23T09:00:00Z",
    )
    assert found[9002].phase is ImportPhase.FAILED and found[9002].reason == "bad row 3"
    assert found[9002].label == "default.loans"
    writer.import_job(9001, 4401, "shelved", files, IMPORT_COMPLETED, db_id=7001)
    assert {i.job_id: i.phase for i in catalog.imports()}[9001] is ImportPhase.COMPLETED


def test_an_import_jobs_segments_and_what_compaction_made_of_them(etcd: Any, root: str) -> None:
    """A 2.4+ job's segments are those its import tasks wrote (pre-import tasks write none);
    the data coordinator's segment records name what a compaction was made from."""
    writer = Catalog26Writer(etcd, root)
    writer.import_job(9101, 4501, "stock", [["a.parquet"], ["b.parquet"]], IMPORT_COMPLETED)
    writer.import_task(9201, 9101, 4501, [61, 62])
    writer.import_task(9202, 9101, 4501, [63])
    writer.import_task(9203, 9999, 4501, [64])  # another job's
    catalog = SourceCatalog(etcd, root)
    (job,) = [i for i in catalog.imports() if i.job_id == 9101]
    assert sorted(job.segments) == [61, 62, 63], job

    writer.segment(4501, 61, 6, 100)  # dropped: compacted into 70 with 62
    writer.segment(4501, 62, 6, 100)
    writer.segment(4501, 63, 4, 50)
    writer.segment(4501, 70, 4, 200, compaction_from=[61, 62])
    writer.segment(4502, 80, 4, 9)  # another collection's
    segments = catalog.segments(4501)
    assert sorted(segments) == [61, 62, 63, 70]
    assert segments[70].compaction_from == (61, 62) and segments[70].rows == 200
    assert (segments[61].state, segments[63].state) == (6, 4)
    assert unserved(job.segments, {63, 70}, segments) == []
    assert unserved(job.segments, {63}, segments) == [61, 62]
