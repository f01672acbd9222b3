"""Decoding msgstream payloads (built with the protobufs Milvus itself writes) and the order in
which a batch reaches the target."""

from __future__ import annotations

from pymilvus.grpc_gen import common_pb2, milvus_pb2, msg_pb2, schema_pb2

from replicator.codec.msgstream import decode, message_header, record_time
from replicator.codec.wire import encode_varint, find_varint_field, to_signed64
from replicator.events import (
    CreateCollection,
    Delete,
    FailedRecord,
    Insert,
    RawRecord,
    Skipped,
    TimeTick,
)
from replicator.pipeline.apply import delete_keys, order_for_target
from replicator.sinks.column_merge import merge_columns

TS = (1_700_000_000_000 << 18) + 5


def record(message, offset: int = 7) -> RawRecord:
    return RawRecord(
        "by-dev-rootcoord-dml_0",
        offset.to_bytes(8, "little"),
        message.SerializeToString(),
        offset=offset,
    )


def insert_request(collection_id: int, pks: list[int], ts: int = TS) -> msg_pb2.InsertRequest:
    request = msg_pb2.InsertRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Insert, timestamp=0),
        shardName=f"by-dev-rootcoord-dml_0_{collection_id}v0",
        collection_name="c",
        partition_name="_default",
        collectionID=collection_id,
        timestamps=[ts] * len(pks),
        num_rows=len(pks),
        version=msg_pb2.ColumnBased,
    )
    pk = request.fields_data.add(field_name="id", field_id=100, type=schema_pb2.Int64)
    pk.scalars.long_data.data.extend(pks)
    vec = request.fields_data.add(field_name="v", field_id=101, type=schema_pb2.FloatVector)
    vec.vectors.dim = 2
    vec.vectors.float_vector.data.extend([float(p) for p in pks for _ in range(2)])
    return request


def delete_request(collection_id: int, pks: list[int], ts: int = TS) -> msg_pb2.DeleteRequest:
    request = msg_pb2.DeleteRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Delete, timestamp=ts),
        collection_name="c",
        collectionID=collection_id,
        timestamps=[ts] * len(pks),
        num_rows=len(pks),
    )
    request.primary_keys.int_id.data.extend(pks)
    return request


def test_insert_is_decoded_with_row_timestamp_and_columns():
    event = decode(record(insert_request(444, [1, 2, 3])), "kafka", lambda cid: cid == 444)
    assert isinstance(event, Insert)
    assert (event.collection_id, event.num_rows, event.ts) == (444, 3, TS)
    assert list(event.request.fields_data[0].scalars.long_data.data) == [1, 2, 3]


def test_a_dml_events_size_is_its_bodys_bytes_as_read():
    """(counted in the task's bytes by type without serializing the request again)"""
    for request in (insert_request(444, [1, 2, 3]), delete_request(444, [4, 5])):
        event = decode(record(request), "kafka", lambda cid: True)
        assert isinstance(event, (Insert, Delete))
        assert event.size == len(request.SerializeToString()) == event.request.ByteSize()


def test_unselected_collections_are_skipped_before_the_body_is_parsed():
    payload = insert_request(445, [1]).SerializeToString()
    # the routing fields are read off the wire, without parsing the columns
    assert find_varint_field(payload, 7) == 445
    assert message_header(payload) == (common_pb2.Insert, 0)
    event = decode(record(insert_request(445, [1])), "kafka", lambda cid: False)
    assert isinstance(event, Skipped)
    assert "445" in event.reason
    # an upsert's Insert (MsgBase timestamp 0) is skipped at its rows' time, not at 0: a
    # collection unknown to the task is told from one dropped before it by that time
    assert event.ts == TS


def test_a_records_time_is_its_rows_when_its_base_has_none():
    upsert_insert = insert_request(445, [1, 2]).SerializeToString()  # base timestamp 0
    assert record_time(upsert_insert) == (common_pb2.Insert, TS)
    delete = delete_request(445, [1], ts=TS + 3).SerializeToString()
    assert record_time(delete) == (common_pb2.Delete, TS + 3)
    # a single row's timestamp written unpacked (wire type 0), which a parser must accept
    field = msg_pb2.InsertRequest.DESCRIPTOR.fields_by_name["timestamps"].number
    base = common_pb2.MsgBase(msg_type=common_pb2.Insert)
    one_row = msg_pb2.InsertRequest(base=base, collectionID=445).SerializeToString()
    one_row += encode_varint(field << 3) + encode_varint(TS)
    assert list(msg_pb2.InsertRequest.FromString(one_row).timestamps) == [TS]
    assert record_time(one_row) == (common_pb2.Insert, TS)
    tick = msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=9))
    assert record_time(tick.SerializeToString()) == (common_pb2.TimeTick, 9)


def test_time_tick_and_negative_ids():
    tick = msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=TS))
    assert decode(record(tick), "kafka", lambda cid: True) == TimeTick(ts=TS)
    assert to_signed64((1 << 64) - 1) == -1


def test_create_collection_carries_the_full_schema():
    schema = schema_pb2.CollectionSchema(name="c", enable_dynamic_field=True)
    schema.fields.add(fieldID=100, name="id", is_primary_key=True, data_type=schema_pb2.Int64)
    create = msg_pb2.CreateCollectionRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.CreateCollection, timestamp=TS),
        collectionName="c",
        collectionID=9,
        schema=schema.SerializeToString(),
        virtualChannelNames=["by-dev-rootcoord-dml_0_9v0"],
        physicalChannelNames=["by-dev-rootcoord-dml_0"],
    )
    event = decode(record(create), "kafka", lambda cid: False)  # DDL is decoded regardless
    assert isinstance(event, CreateCollection)
    assert event.schema == schema
    assert event.pchannels == ("by-dev-rootcoord-dml_0",)


def test_garbage_is_a_failed_record_naming_the_position():
    bad = RawRecord(
        "by-dev-rootcoord-dml_3", (12).to_bytes(8, "little"), b"\xff\xff\xff", offset=12
    )
    event = decode(bad, "kafka", lambda cid: True)
    assert isinstance(event, FailedRecord)
    assert event.position.pchannel == "by-dev-rootcoord-dml_3"
    assert "undecodable" in event.reason


def _events(*requests):
    return [decode(record(r), "kafka", lambda cid: True) for r in requests]


def test_upsert_pair_is_applied_delete_first():
    # Milvus writes an upsert as Insert then Delete at one timestamp
    earlier_insert, upsert_insert, upsert_delete = _events(
        insert_request(1, [5], ts=TS - 10),
        insert_request(1, [5], ts=TS),
        delete_request(1, [5], ts=TS),
    )
    ordered = order_for_target([earlier_insert, upsert_insert, upsert_delete])
    assert [type(e).__name__ for e in ordered] == ["Insert", "Delete", "Insert"]
    assert ordered[0] is earlier_insert
    assert ordered[2] is upsert_insert
    assert delete_keys(upsert_delete.request) == [5]


def test_a_later_delete_stays_after_the_insert():
    insert, delete = _events(insert_request(1, [5], ts=TS), delete_request(1, [5], ts=TS + 1))
    assert order_for_target([insert, delete]) == [insert, delete]


def test_inserts_merge_column_by_column():
    a, b, c = _events(insert_request(1, [1, 2]), insert_request(1, [3]), insert_request(1, [4]))
    request = milvus_pb2.InsertRequest(fields_data=a.request.fields_data)
    merge_columns(request.fields_data, [b.request.fields_data, c.request.fields_data])
    columns = request.fields_data
    assert list(columns[0].scalars.long_data.data) == [1, 2, 3, 4]
    assert list(columns[1].vectors.float_vector.data) == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    assert columns[1].vectors.dim == 2
    assert list(a.request.fields_data[0].scalars.long_data.data) == [1, 2], "events unchanged"


def test_single_field_lookups_agree_with_the_whole_message_walk():
    """find_varint_field/find_bytes_field (one tight loop, used on every record) give what
    walking every field gives, on real messages and on random bytes, errors included."""
    import random

    from replicator.codec.wire import WireError, find_bytes_field, iter_fields

    def walked(buf: bytes, number: int, wire_type: int):
        for n, t, value in iter_fields(buf):
            if n == number and t == wire_type:
                return value
        return None

    def outcome(lookup, *args):
        try:
            return lookup(*args)
        except WireError:
            return "error"

    rnd = random.Random(5)
    real = [
        insert_request(446_000_000_000_123, [1, 2, 3]).SerializeToString(),
        delete_request(7, [4]).SerializeToString(),
        msg_pb2.TimeTickMsg(
            base=common_pb2.MsgBase(msg_type=1200, timestamp=TS)
        ).SerializeToString(),
    ]
    buffers = [
        *real,
        *(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40))) for _ in range(3000)),
    ]
    # cut real messages short anywhere: truncations
    buffers += [m[: rnd.randrange(len(m))] for m in real for _ in range(200)]
    errors = 0
    for buf in buffers:
        for number in (1, 3, 7):
            expected = outcome(walked, buf, number, 0)
            assert outcome(find_varint_field, buf, number) == expected, (buf, number)
            expected = outcome(walked, buf, number, 2)
            assert outcome(find_bytes_field, buf, number) == expected, (buf, number)
            errors += expected == "error"
    assert errors > 100  # the random bytes do reach the error paths
    assert find_varint_field(real[0], 7) == 446_000_000_000_123


def _column(name: str, **kwargs) -> schema_pb2.FieldData:
    return schema_pb2.FieldData(field_name=name, **kwargs)


def test_byte_vectors_sparse_and_struct_arrays_merge_row_by_row():
    """Two inserts of 6 and 4 rows merged into one request keep every row of a byte-typed
    vector (MergeFrom alone replaced the bytes with the last batch's), the larger sparse dim,
    and a struct array's sub-fields as one column each."""
    rows = (6, 4)
    byte_kinds = {"binary_vector": 1, "float16_vector": 4, "bfloat16_vector": 4, "int8_vector": 2}

    def batch(index: int, count: int) -> list[schema_pb2.FieldData]:
        columns = [
            _column(
                kind,
                vectors=schema_pb2.VectorField(
                    dim=16, **{kind: bytes([index * 10 + row for row in range(count)]) * width}
                ),
            )
            for kind, width in byte_kinds.items()
        ]
        sparse = schema_pb2.SparseFloatArray(
            contents=[bytes([index, row]) for row in range(count)], dim=100 if index else 300
        )
        columns.append(
            _column("sparse", vectors=schema_pb2.VectorField(sparse_float_vector=sparse))
        )
        sub = _column(
            "tags[name]",
            scalars=schema_pb2.ScalarField(
                string_data=schema_pb2.StringArray(data=[f"{index}-{row}" for row in range(count)])
            ),
        )
        columns.append(_column("tags", struct_arrays=schema_pb2.StructArrayField(fields=[sub])))
        return columns

    request = milvus_pb2.InsertRequest(fields_data=batch(0, rows[0]))
    merge_columns(request.fields_data, [batch(1, rows[1])])
    merged = {column.field_name: column for column in request.fields_data}
    for position, (kind, width) in enumerate(byte_kinds.items()):
        expected = b"".join(
            getattr(batch(index, count)[position].vectors, kind) for index, count in enumerate(rows)
        )
        assert getattr(merged[kind].vectors, kind) == expected, kind
        assert len(expected) == width * sum(rows), kind
    sparse = merged["sparse"].vectors.sparse_float_vector
    assert len(sparse.contents) == sum(rows) and sparse.dim == 300
    (sub,) = merged["tags"].struct_arrays.fields
    assert list(sub.scalars.string_data.data) == [f"0-{r}" for r in range(6)] + [
        f"1-{r}" for r in range(4)
    ]
