"""Every 2.6 DDL operation applied to a real target, Milvus Lite and a real Milvus 2.3.5, and the
target's state checked through pymilvus; each is applied twice (a replay after a crash must
change nothing). Where a target lacks a feature the documented skip is asserted instead.

Operations come from the test writer's records through decode_any and decode_ddl, so the
whole path from a 2.6 record to the target is exercised. The source database "src" maps to a
per-test target database and "orders" to "orders_copy" (the task's name mapping)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from harness.streaming_ddl_writer import DdlWriter
from harness.streaming_writer import StreamingWriter, Written, collection_schema, row_columns
from pymilvus import MilvusClient
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from replicator.codec import streaming_ddl as ddl
from replicator.codec import streaming_ddl_ops as ddl_ops
from replicator.codec.streaming import decode_any
from replicator.codec.streaming_events import StreamDdl
from replicator.config.task_spec import TaskSpec
from replicator.errors import TargetUnavailableError, TaskFailedError
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.stream_ddl import StreamDdlApplier, TaskNames
from replicator.sinks.milvus import MilvusTarget

pytestmark = pytest.mark.integration

CONTROL = "by-dev-rootcoord-dml_0_vcchan"
VCHANNELS = ["by-dev-rootcoord-dml_0_1001v0"]
COLLECTION_ID = 1001
SRC_DB = (7, "src")  # (id, name)
TARGETS = ["lite", pytest.param("m235", marks=pytest.mark.e2e)]
FLAT = {"index_type": "FLAT", "metric_type": "L2", "params": "{}"}


@dataclass
class Env:
    kind: str
    uri: str
    db: str  # the target database "src" maps to
    name: str  # the target name of source collection "orders"
    target: MilvusTarget
    applier: StreamDdlApplier
    names: TaskNames
    writer: DdlWriter

    def client(self) -> MilvusClient:
        return MilvusClient(uri=self.uri, db_name=self.db, dedicated=True)

    def apply(self, record: Written) -> ddl_ops.DdlOp:
        event = decode_any(record.raw_record(), "kafka", lambda _c: True)
        assert isinstance(event, StreamDdl), event
        return ddl.decode_ddl(event)

    def run(self, record: Written, *, twice: bool = True) -> tuple[str, str]:
        """Apply the record's operation (twice by default); the two statuses."""
        op = self.apply(record)
        first = self.applier.apply(op).status
        second = self.applier.apply(op).status if twice else ""
        return first, second


@pytest.fixture(params=TARGETS)
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    kind = request.param
    service = request.getfixturevalue(
        "milvus_lite_service" if kind == "lite" else "milvus_source_rocksmq"
    )
    suffix = uuid.uuid4().hex[:8]
    db, name = f"t_{suffix}", "orders_copy"
    selection = TaskSelection.from_spec(
        TaskSpec.from_stored(
            {
                "db_collections": {"src": [{"name": "*"}]},
                "name_mapping": [
                    {"source_db": "src", "target_db": db, "collection_mapping": {"orders": name}}
                ],
            }
        )
    )
    registry = CollectionRegistry(selection, "_default")
    source_schema = collection_schema("orders")
    registry.add(COLLECTION_ID, "src", "orders", source_schema, ("by-dev-rootcoord-dml_0",))
    # the root user's credentials: a 2.3.5 without authorization still needs a grantor
    target = MilvusTarget({"uri": service.uri, "username": "root", "password": "Milvus"})
    target.create_collection(db, name, source_schema, shards=1)
    names = TaskNames.for_task(registry.resolve, selection)
    names.remember_schema(COLLECTION_ID, source_schema)
    writer = DdlWriter(StreamingWriter(None), CONTROL)
    applier = StreamDdlApplier(target, names, rbac=True)
    yield Env(kind, service.uri, db, name, target, applier, names, writer)
    for collection in target.list_collections(db):
        target.drop_collection(db, collection)
    target.drop_database(db)
    target.close()


def insert_rows(env: Env, pks: list[int]) -> None:
    env.target.insert(env.db, env.name, "", row_columns(pks), len(pks))


def count_rows(env: Env) -> int:
    client = env.client()
    try:
        client.load_collection(env.name)
        rows = client.query(env.name, filter="id >= 0", output_fields=["id"])
        return len(rows)
    finally:
        client.close()


# --- databases ---------------------------------------------------------------------------------


def test_database_create_alter_drop(env: Env) -> None:
    # a second source database mapped by name (no mapping entry: same name on the target)
    extra = f"x_{uuid.uuid4().hex[:8]}"
    selection = TaskSelection.from_spec(
        TaskSpec.from_stored({"db_collections": {"*": [{"name": "*"}]}})
    )
    names = TaskNames.for_task(lambda _c: None, selection)
    applier = StreamDdlApplier(env.target, names)
    w = env.writer

    op = env.apply(w.create_database(extra, 9, {"database.max.collections": "10"}))
    assert applier.apply(op).status == "applied"
    assert applier.apply(op).status == "unchanged"
    assert extra in env.target.list_databases()

    altered = applier.apply(
        env.apply(w.alter_database(extra, 9, {"database.max.collections": "5"}))
    )
    if env.kind == "lite":
        assert altered.status == "applied"
        assert env.target.describe_database(extra)["database.max.collections"] == "5"
    else:  # Milvus 2.3 has no AlterDatabase
        assert altered.status == "skipped" and "does not offer" in altered.detail

    env.target.create_collection(extra, "keep_me", collection_schema("keep_me"), shards=1)
    dropped = env.apply(w.drop_database(extra, 9))
    assert dropped.barrier
    kept = applier.apply(dropped)
    assert kept.status == "skipped" and "keep_me" in kept.detail
    assert extra in env.target.list_databases()

    env.target.drop_collection(extra, "keep_me")
    assert applier.apply(dropped).status == "applied"
    assert extra not in env.target.list_databases()
    assert applier.apply(dropped).status == "unchanged"


def test_database_not_selected_is_left_alone(env: Env) -> None:
    other = f"o_{uuid.uuid4().hex[:8]}"
    assert env.run(env.writer.create_database(other, 11, {})) == ("not_selected", "not_selected")
    assert other not in env.target.list_databases()


def test_database_of_the_mapping_is_created_under_the_target_name(env: Env) -> None:
    env.target.drop_collection(env.db, env.name)
    env.target.drop_database(env.db)
    assert env.run(env.writer.create_database("src", 7, {})) == ("applied", "unchanged")
    assert env.db in env.target.list_databases()
    assert "src" not in env.target.list_databases()


# --- aliases -----------------------------------------------------------------------------------


def test_alias_create_move_drop(env: Env) -> None:
    w = env.writer
    assert env.run(w.alter_alias(SRC_DB, (COLLECTION_ID, "orders"), "current")) == (
        "applied",
        "unchanged",
    )
    assert env.target.aliases_of(env.db, env.name) == ["current"]
    assert env.run(w.alter_alias(SRC_DB, (4242, "not_replicated"), "x")) == (
        "not_selected",
        "not_selected",
    )
    assert env.run(w.drop_alias(SRC_DB, "current")) == ("applied", "unchanged")
    assert env.target.aliases_of(env.db, env.name) == []


# --- indexes -----------------------------------------------------------------------------------


def test_index_create_alter_drop(env: Env) -> None:
    w = env.writer
    created = w.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT, user_params=FLAT)
    assert env.run(created) == ("applied", "unchanged")
    indexes = env.target.describe_indexes(env.db, env.name)
    assert [(i.field_name, {p.key: p.value for p in i.params}["index_type"]) for i in indexes] == [
        ("vector", "FLAT")
    ]
    if env.kind == "m235":
        assert indexes[0].index_name == "vec_idx"  # Milvus Lite names it after the field

    fi = w.field_index(COLLECTION_ID, 101, 555, "vec_idx", {**FLAT, "mmap.enabled": "true"})
    altered = env.applier.apply(env.apply(w.alter_index(COLLECTION_ID, [fi])))
    assert altered.status == "skipped"  # neither Milvus Lite nor 2.3.5 alters an index
    assert "does not offer" in altered.detail

    unknown = env.applier.apply(env.apply(w.drop_index(COLLECTION_ID, [999])))
    assert unknown.status == "skipped" and "[999]" in unknown.detail
    assert len(env.target.describe_indexes(env.db, env.name)) == 1

    assert env.run(w.drop_index(COLLECTION_ID, [555])) == ("applied", "unchanged")
    assert env.target.describe_indexes(env.db, env.name) == []


def test_drop_every_index(env: Env) -> None:
    env.run(env.writer.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT), twice=False)
    assert env.run(env.writer.drop_index(COLLECTION_ID, [])) == ("applied", "unchanged")
    assert env.target.describe_indexes(env.db, env.name) == []


# --- load configuration ------------------------------------------------------------------------


def load_state(env: Env, partition: str = "") -> str:
    """The load state once it settles (a load is asynchronous on a real Milvus)."""
    client = env.client()
    try:
        deadline = time.monotonic() + 60
        while True:
            state = str(client.get_load_state(env.name, partition_name=partition)["state"])
            if not state.endswith("Loading") or time.monotonic() > deadline:
                return state
            time.sleep(0.2)
    finally:
        client.close()


def test_load_and_release(env: Env) -> None:
    w = env.writer
    env.run(w.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT), twice=False)
    env.names.remember_partition(COLLECTION_ID, 10, "_default")
    assert env.run(w.load(COLLECTION_ID, [10])) == ("applied", "applied")
    assert load_state(env).endswith("Loaded")

    more = env.applier.apply(env.apply(w.load(COLLECTION_ID, [10], replicas=2)))
    if env.kind == "m235":  # one query node, and 2.3 keeps a loaded collection's replicas
        assert more.status == "skipped" and "replica" in more.detail
    else:  # Milvus Lite accepts and ignores the replica count
        assert more.status == "applied"

    released = env.apply(w.release(COLLECTION_ID))
    assert released.barrier
    assert env.applier.apply(released).status == "applied"
    assert load_state(env).endswith("NotLoad")
    assert env.applier.apply(released).status == "unchanged"


def test_load_some_partitions(env: Env) -> None:
    w = env.writer
    env.run(w.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT), twice=False)
    env.target.create_partition(env.db, env.name, "p2026")
    env.names.remember_partition(COLLECTION_ID, 10, "_default")
    env.names.remember_partition(COLLECTION_ID, 11, "p2026")
    outcome = env.applier.apply(env.apply(w.load(COLLECTION_ID, [11])))
    if env.kind == "m235":
        assert outcome.status == "applied" and "p2026" in outcome.detail
        assert load_state(env, "p2026").endswith("Loaded")
        assert load_state(env, "_default").endswith("NotLoad")
    else:  # no partition load state in Milvus Lite: the whole collection is loaded
        assert outcome.status == "skipped" and "loaded all" in outcome.detail
        assert load_state(env).endswith("Loaded")


# --- collections -------------------------------------------------------------------------------


def properties(env: Env) -> dict[str, str]:
    described = env.target.describe_collection(env.db, env.name)
    return {p.key: p.value for p in described.properties}


def test_alter_collection_properties(env: Env) -> None:
    w = env.writer
    records = w.alter_collection(
        COLLECTION_ID, VCHANNELS, ["properties"], properties={"collection.ttl.seconds": "3600"}
    )
    assert env.run(records[0]) == ("applied", "unchanged")
    assert properties(env)["collection.ttl.seconds"] == "3600"

    gone = env.applier.apply(env.apply(w.alter_collection(COLLECTION_ID, [], ["properties"])[0]))
    if env.kind == "lite":
        assert gone.status == "applied"
        assert "collection.ttl.seconds" not in properties(env)
    else:  # 2.3.5: "only support alter collection properties, but collection properties is empty"
        assert gone.status == "skipped" and "cannot delete keys" in gone.detail

    described = env.applier.apply(
        env.apply(w.alter_collection(COLLECTION_ID, [], ["description"], description="d")[0])
    )
    assert described.status == "skipped" and "public API" in described.detail


def test_a_field_the_target_cannot_add_stops_the_task_naming_it(env: Env) -> None:
    schema = collection_schema("orders")
    schema.fields.add(fieldID=103, name="extra", data_type=schema_pb2.Int64, nullable=True)
    op_record = env.writer.alter_collection(
        COLLECTION_ID, VCHANNELS, ["schema", "properties"], schema=schema
    )[0]
    op = env.apply(op_record)
    # the rows that follow would carry the field, so the task stops here, naming the
    # collection, the field and its type: 2.3.5 by the version matrix, before any call (it
    # holds no nullable field); Milvus Lite, which would hold it, offers no AddCollectionField
    with pytest.raises(TaskFailedError) as failed:
        env.applier.apply(op)
    message = str(failed.value)
    assert f"collection {env.db}.{env.name}" in message
    if env.kind == "lite":
        assert "field extra (Int64)" in message and "AddCollectionField" in message
    else:
        assert (
            ": the target (Milvus 2.3.5-lite) cannot hold field extra (Int64, nullable; nullable "
            "field is held from Milvus 2.5.0) of the source's schema, so field extra is not "
            "added there" in message
        )
    assert env.names.field(COLLECTION_ID, 103) == "extra"  # the new schema is remembered


def test_rename_collection(env: Env) -> None:
    record = env.writer.alter_collection(
        COLLECTION_ID, [], ["collection_name"], collection_name="orders2"
    )[0]
    op = env.apply(record)
    outcome = env.applier.apply(op)
    assert outcome.status == "applied", outcome
    assert env.target.has_collection(env.db, "orders2")
    assert not env.target.has_collection(env.db, env.name)


def test_truncate_keeps_indexes_aliases_and_load_state(env: Env) -> None:
    w = env.writer
    env.run(w.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT), twice=False)
    env.run(w.alter_alias(SRC_DB, (COLLECTION_ID, "orders"), "current"), twice=False)
    env.target.create_partition(env.db, env.name, "p2026")
    insert_rows(env, [1, 2, 3])
    assert count_rows(env) == 3  # count_rows loads it

    op = env.apply(w.writer.truncate_collection(COLLECTION_ID, VCHANNELS, [7])[0])
    assert op.barrier
    outcome = env.applier.apply(op)
    assert outcome.status == "applied"
    if env.kind == "m235":
        assert "re-created" in outcome.detail  # 2.3 has no TruncateCollection
    assert load_state(env).endswith("Loaded")
    assert count_rows(env) == 0
    assert [i.field_name for i in env.target.describe_indexes(env.db, env.name)] == ["vector"]
    assert env.target.aliases_of(env.db, env.name) == ["current"]
    assert "p2026" in env.target.partitions(env.db, env.name)
    insert_rows(env, [4])  # still writable with the same schema
    assert count_rows(env) == 1
    assert env.applier.apply(op).status == "applied"  # truncating again: still empty
    assert count_rows(env) == 0


def test_a_truncate_that_failed_half_way_is_finished_when_applied_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Milvus Lite under load once dropped the collection and then failed the truncate
    ("[Errno 39] Directory not empty"); the record, read again, found no collection to
    describe and failed the task. Applied again, the truncate now makes the collection from
    what it read before the first try: empty, with its index, alias and load state."""
    w = env.writer
    env.run(w.create_index(COLLECTION_ID, 101, 555, "vec_idx", FLAT), twice=False)
    env.run(w.alter_alias(SRC_DB, (COLLECTION_ID, "orders"), "current"), twice=False)
    insert_rows(env, [1, 2, 3])
    assert count_rows(env) == 3
    op = env.apply(w.writer.truncate_collection(COLLECTION_ID, VCHANNELS, [7])[0])
    target = env.target

    def half_way(db: str, name: str) -> None:
        target.drop_collection(db, name)
        raise TargetUnavailableError("truncate collection: [Errno 39] Directory not empty")

    monkeypatch.setattr(target, "truncate_collection", half_way)
    with pytest.raises(TargetUnavailableError):
        env.applier.apply(op)
    assert not target.has_collection(env.db, env.name)
    monkeypatch.undo()
    assert env.applier.apply(op).status == "applied"
    assert count_rows(env) == 0
    assert [i.field_name for i in target.describe_indexes(env.db, env.name)] == ["vector"]
    assert target.aliases_of(env.db, env.name) == ["current"]
    assert load_state(env).endswith("Loaded")
    insert_rows(env, [4])
    assert count_rows(env) == 1


# --- RBAC --------------------------------------------------------------------------------------

BCRYPT = "$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"


def test_rbac_is_applied_only_when_the_task_asks(env: Env) -> None:
    applier = StreamDdlApplier(env.target, env.names, rbac=False)
    op = env.apply(env.writer.alter_role("never"))
    assert applier.apply(op).status == "disabled"
    if env.kind == "m235":
        assert "never" not in env.target.rbac.list_roles()


def test_users_roles_grants(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    w = env.writer
    user, role = f"u_{uuid.uuid4().hex[:8]}", f"r_{uuid.uuid4().hex[:8]}"
    if env.kind == "lite":  # Milvus Lite has no users or roles
        assert env.applier.apply(env.apply(w.alter_user(user, BCRYPT))).status == "skipped"
        with pytest.raises(Exception, match="UNIMPLEMENTED"):
            env.target.rbac.create_role(role)
        assert env.applier.apply(env.apply(w.alter_role(role))).status == "skipped"
        return
    assert env.run(w.alter_user(user, BCRYPT)) == ("applied", "skipped")
    assert user in env.target.rbac.list_users()
    assert BCRYPT not in caplog.text

    assert env.run(w.alter_role(role)) == ("applied", "unchanged")
    assert env.run(w.user_role(user, role)) == ("applied", "applied")  # 2.3.5: binding twice is OK
    client = MilvusClient(uri=env.uri, dedicated=True, user="root", password="Milvus")
    try:
        assert role in client.describe_user(user)["roles"]
        entity = w.grant_entity(role, "Collection", "orders", "Query", db="src")
        assert env.run(w.privilege(entity)) == ("applied", "applied")
        grants = env.target.rbac.grants(role, env.db)
        assert [(g.db_name, g.object_name, g.grantor.privilege.name) for g in grants] == [
            (env.db, env.name, "Query")
        ]
        assert env.run(w.privilege(entity, grant=False))[0] == "applied"
        assert env.target.rbac.grants(role, env.db) == []

        group = env.applier.apply(env.apply(w.privilege_group("readers", ["Query"])))
        assert group.status == "skipped"  # privilege groups came with 2.5
        restore = env.applier.apply(env.apply(w.restore_rbac(milvus_pb2.RBACMeta())))
        assert restore.status == "skipped"  # so did RestoreRBAC

        assert env.run(w.user_role(user, role, grant=False))[0] == "applied"
        assert role not in client.describe_user(user)["roles"]
    finally:
        client.close()
    assert env.run(w.drop_role(role)) == ("applied", "unchanged")
    assert role not in env.target.rbac.list_roles()
    assert env.run(w.drop_user(user)) == ("applied", "applied")  # 2.3.5 drops absent users
    assert user not in env.target.rbac.list_users()
