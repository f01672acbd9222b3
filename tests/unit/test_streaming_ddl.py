"""2.6 DDL round trips: the test writer (tests/harness/streaming_ddl_writer.py, protobuf runtime)
writes each message in memory, decode_any reads the record, decode_ddl turns it into the
operation; every field the applier uses is checked, and the barrier/first-copy rule per type."""

from __future__ import annotations

import base64

import pytest
from harness.streaming_ddl_writer import DdlWriter
from harness.streaming_writer import StreamingWriter, Written, collection_schema
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from replicator.codec import streaming_ddl as ddl
from replicator.codec import streaming_ddl_ops as ddl_ops
from replicator.codec import streaming_headers as sh
from replicator.codec.streaming import decode_any
from replicator.codec.streaming_events import StreamDdl
from replicator.codec.wire import WireError

CONTROL = "by-dev-rootcoord-dml_0_vcchan"
VCHANNELS = ["by-dev-rootcoord-dml_0_1001v0", "by-dev-rootcoord-dml_1_1001v1"]


@pytest.fixture
def w() -> DdlWriter:
    return DdlWriter(StreamingWriter(None, start_ms=1_700_000_000_000), CONTROL)


def op_of(record: Written) -> ddl_ops.DdlOp:
    event = decode_any(record.raw_record(), "kafka", lambda _c: True)
    assert isinstance(event, StreamDdl), event
    return ddl.decode_ddl(event)


def test_create_alter_drop_database(w: DdlWriter) -> None:
    created = w.create_database("sales", 7, {"database.replica.number": "2"})
    assert created.properties[sh.VCHANNEL] == CONTROL
    op = op_of(created)
    assert isinstance(op, ddl_ops.CreateDatabase)
    assert (op.db_name, op.db_id, op.properties) == (
        "sales",
        7,
        (("database.replica.number", "2"),),
    )
    assert not op.barrier and not op.rbac
    assert op.broadcast_id > 0 and op.ts == created.time_tick

    altered = op_of(w.alter_database("sales", 7, {"a": "1", "b": "2"}, replica_number=3))
    assert isinstance(altered, ddl_ops.AlterDatabase)
    assert altered.properties == (("a", "1"), ("b", "2"))
    assert altered.replica_number == 3 and not altered.barrier

    dropped = op_of(w.drop_database("sales", 7))
    assert isinstance(dropped, ddl_ops.DropDatabase)
    assert dropped.db_name == "sales" and dropped.barrier


def test_aliases(w: DdlWriter) -> None:
    op = op_of(w.alter_alias((7, "sales"), (1001, "orders"), "current"))
    assert isinstance(op, ddl_ops.AlterAlias)
    assert (op.db_name, op.collection_id, op.collection_name, op.alias) == (
        "sales",
        1001,
        "orders",
        "current",
    )
    assert not op.barrier
    dropped = op_of(w.drop_alias((7, "sales"), "current"))
    assert isinstance(dropped, ddl_ops.DropAlias)
    assert (dropped.db_name, dropped.alias, dropped.barrier) == ("sales", "current", True)


def test_indexes(w: DdlWriter) -> None:
    params = {"index_type": "HNSW", "metric_type": "L2", "params": '{"M": 8}'}
    user = {"index_type": "AUTOINDEX", "metric_type": "L2"}
    op = op_of(w.create_index(1001, 101, 555, "vec_idx", params, user_params=user))
    assert isinstance(op, ddl_ops.CreateIndex)
    assert op.collection_id == 1001 and not op.barrier
    spec = op.index
    assert (spec.index_id, spec.index_name, spec.field_id) == (555, "vec_idx", 101)
    assert dict(spec.index_params) == params
    assert dict(spec.request_params) == user  # the user's own params win
    assert spec.is_auto_index

    fi = w.field_index(1001, 101, 555, "vec_idx", {**params, "mmap.enabled": "true"})
    altered = op_of(w.alter_index(1001, [fi]))
    assert isinstance(altered, ddl_ops.AlterIndex)
    assert [i.index_name for i in altered.indexes] == ["vec_idx"]
    assert dict(altered.indexes[0].index_params)["mmap.enabled"] == "true"

    dropped = op_of(w.drop_index(1001, [555, 556]))
    assert isinstance(dropped, ddl_ops.DropIndex)
    assert dropped.index_ids == (555, 556) and dropped.barrier
    assert op_of(w.drop_index(1001, [])).index_ids == ()  # "every index"


def test_load_and_release(w: DdlWriter) -> None:
    op = op_of(w.load(1001, [11, 10], replicas=2, field_ids=[101, 100]))
    assert isinstance(op, ddl_ops.LoadConfig)
    assert op.collection_id == 1001
    assert op.partition_ids == (10, 11)
    assert op.load_field_ids == (100, 101)
    assert op.replica_number == 2
    assert op.resource_groups == ("__default_resource_group",)
    assert not op.barrier
    released = op_of(w.release(1001))
    assert isinstance(released, ddl_ops.ReleaseCollection)
    assert released.collection_id == 1001 and released.barrier


def test_alter_collection_properties_goes_to_control_and_vchannels(w: DdlWriter) -> None:
    copies = w.alter_collection(
        1001,
        VCHANNELS,
        ["properties", "description", "consistency_level"],
        properties={"collection.ttl.seconds": "60"},
        description="orders of 2026",
        consistency_level=2,
    )
    assert [c.properties[sh.VCHANNEL] for c in copies] == [CONTROL, *VCHANNELS]
    ops = [op_of(c) for c in copies]
    assert len({op.broadcast_id for op in ops}) == 1
    op = ops[0]
    assert isinstance(op, ddl_ops.AlterCollection)
    assert op.changes == {"properties", "description", "consistency"}
    assert op.properties == (("collection.ttl.seconds", "60"),)
    assert (op.description, op.consistency_level) == ("orders of 2026", 2)
    assert op.schema is None and not op.barrier


def test_alter_collection_rename_and_schema(w: DdlWriter) -> None:
    renamed = op_of(w.alter_collection(1001, [], ["collection_name"], collection_name="o2")[0])
    assert isinstance(renamed, ddl_ops.AlterCollection)
    assert renamed.changes == {"name"} and renamed.new_name == "o2"

    schema = collection_schema("orders")
    schema.fields.add(fieldID=103, name="extra", data_type=schema_pb2.Int64, nullable=True)
    added = op_of(w.alter_collection(1001, [], ["schema", "properties"], schema=schema)[0])
    assert isinstance(added, ddl_ops.AlterCollection)
    assert "schema" in added.changes and added.schema is not None
    assert [f.name for f in added.schema.fields] == ["id", "vector", "tag", "extra"]

    legacy = op_of(w.schema_change(1001, VCHANNELS, schema)[0])
    assert isinstance(legacy, ddl_ops.AlterCollection)
    assert legacy.type_name == "SchemaChange" and legacy.changes == {"schema"}
    assert legacy.collection_id == 1001 and legacy.schema == schema


def test_truncate_is_a_barrier(w: DdlWriter) -> None:
    op = op_of(w.writer.truncate_collection(1001, VCHANNELS, [7])[1])
    assert isinstance(op, ddl_ops.TruncateCollection)
    assert op.collection_id == 1001 and op.barrier


def test_user_keeps_no_password_hash(w: DdlWriter) -> None:
    secret = "$2a$10$abcdefghijklmnopqrstuvCDEFGHIJKLMNOPQRSTUVWXYZ012345"
    record = w.alter_user("alice", secret)
    op = op_of(record)
    assert isinstance(op, ddl_ops.AlterUser)
    assert op.user == "alice" and op.had_password_hash and op.rbac and not op.barrier
    assert secret not in repr(op)  # nothing a log line could print holds the hash
    assert secret.encode() in record.payload  # ... though the record does carry it
    dropped = op_of(w.drop_user("alice"))
    assert isinstance(dropped, ddl_ops.DropUser)
    assert dropped.user == "alice" and dropped.barrier and dropped.rbac


def test_roles_bindings_privileges(w: DdlWriter) -> None:
    role = op_of(w.alter_role("reader"))
    assert isinstance(role, ddl_ops.AlterRole) and role.role == "reader" and role.rbac
    drop = op_of(w.drop_role("reader", force=True))
    assert isinstance(drop, ddl_ops.DropRole) and drop.force and drop.barrier

    bind = op_of(w.user_role("alice", "reader"))
    assert isinstance(bind, ddl_ops.UserRole)
    assert (bind.user, bind.role, bind.grant) == ("alice", "reader", True)
    unbind = op_of(w.user_role("alice", "reader", grant=False))
    assert isinstance(unbind, ddl_ops.UserRole) and not unbind.grant

    entity = w.grant_entity("reader", "Collection", "orders", "Query", db="sales")
    grant = op_of(w.privilege(entity))
    assert isinstance(grant, ddl_ops.Privilege) and grant.grant
    assert grant.entity == entity
    revoke = op_of(w.privilege(entity, grant=False))
    assert isinstance(revoke, ddl_ops.Privilege) and not revoke.grant

    group = op_of(w.privilege_group("readers", ["Query", "Search"]))
    assert isinstance(group, ddl_ops.PrivilegeGroup)
    assert (group.group, group.privileges, group.drop, group.barrier) == (
        "readers",
        ("Query", "Search"),
        False,
        False,
    )
    gone = op_of(w.privilege_group("readers", drop=True))
    assert isinstance(gone, ddl_ops.PrivilegeGroup) and gone.drop and gone.barrier
    fewer = op_of(w.privilege_group("readers", ["Search"], drop=True))
    assert isinstance(fewer, ddl_ops.PrivilegeGroup) and fewer.drop and not fewer.barrier


def test_restore_rbac(w: DdlWriter) -> None:
    meta = milvus_pb2.RBACMeta(
        users=[milvus_pb2.UserInfo(user="bob", roles=[milvus_pb2.RoleEntity(name="reader")])],
        roles=[milvus_pb2.RoleEntity(name="reader")],
    )
    op = op_of(w.restore_rbac(meta))
    assert isinstance(op, ddl_ops.RestoreRBAC) and op.rbac
    assert op.meta == meta


def test_resource_groups_are_not_replicated(w: DdlWriter) -> None:
    record = w.writer.broadcast("DropResourceGroup", [CONTROL], header_bytes=b"\n\x02rg", version=2)
    op = op_of(record[0])
    assert isinstance(op, ddl_ops.NotReplicated)
    assert "DropResourceGroup" in op.reason


def test_malformed_body_names_the_type(w: DdlWriter) -> None:
    record = w.create_database("sales", 7, {})
    event = decode_any(record.raw_record(), "kafka", lambda _c: True)
    assert isinstance(event, StreamDdl)
    broken = StreamDdl(
        ts=event.ts,
        meta=event.meta,
        type_name=event.type_name,
        header=event.header,
        body=b"\x0a\xff",  # a length beyond the end
    )
    with pytest.raises(WireError, match="CreateDatabase body: malformed"):
        ddl.decode_ddl(broken)


def test_missing_names_are_errors(w: DdlWriter) -> None:
    record = w.writer.broadcast(
        "DropUser", [CONTROL], header_bytes=base64.b64decode(""), version=2
    )[0]
    with pytest.raises(ddl.DdlDecodeError, match="DropUser without a user name"):
        op_of(record)


def test_every_applied_type_is_routed_by_the_codec() -> None:
    for name in ddl.APPLIED_TYPES:
        assert name in sh.TYPE_NUMBERS, name


def test_every_operation_type_has_a_handler() -> None:
    from typing import Any, cast

    from replicator.pipeline.stream_ddl import StreamDdlApplier, TaskNames

    applier = StreamDdlApplier(cast(Any, None), TaskNames(lambda _c: None, lambda _d: None))
    op_types = {
        cls
        for cls in vars(ddl).values()
        if isinstance(cls, type) and issubclass(cls, ddl_ops.DdlOp) and cls not in (ddl_ops.DdlOp,)
    } - {ddl_ops.NotReplicated}
    assert set(applier._handlers()) == op_types


def test_rbac_disabled_and_not_replicated_need_no_target(w: DdlWriter) -> None:
    from typing import Any, cast

    from replicator.pipeline.stream_ddl import StreamDdlApplier, TaskNames

    applier = StreamDdlApplier(cast(Any, None), TaskNames(lambda _c: None, lambda _d: None))
    assert applier.apply(op_of(w.alter_role("reader"))).status == "disabled"
    record = w.writer.broadcast("DropResourceGroup", [CONTROL], header_bytes=b"", version=2)[0]
    assert applier.apply(op_of(record)).status == "not_selected"
