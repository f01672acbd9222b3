"""What each target can hold, decided before a collection is created there
(replicator/sinks/target_capabilities.py), and the docs' table rendered from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from replicator.errors import TaskFailedError
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.target_capabilities import (
    FEATURES,
    KAFKA,
    MATRIX_BEGIN,
    MATRIX_END,
    Target,
    Version,
    render_matrix,
    require_holdable,
    target_of,
    unholdable,
)

S = schema_pb2
TABLE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "target-versions.md"


def schema_with(name: str, data_type: int, **flags: object) -> schema_pb2.CollectionSchema:
    schema = schema_pb2.CollectionSchema(name="c")
    schema.fields.add(fieldID=100, name="id", data_type=S.Int64, is_primary_key=True)
    schema.fields.add(fieldID=101, name="vec", data_type=S.FloatVector)
    field = schema.fields.add(fieldID=102, name=name, data_type=data_type, **flags)
    if data_type in (
        S.Float16Vector,
        S.BFloat16Vector,
        S.Int8Vector,
        S.BinaryVector,
        S.SparseFloatVector,
    ):
        del schema.fields[1]  # the only vector field: "a second vector field" stays out of it
        field.type_params.add(key="dim", value="8")
    return schema


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v2.3.5", Version(2, 3, 5)),
        ("2.3.5", Version(2, 3, 5)),
        ("v2.6.0", Version(2, 6, 0)),
        ("2.4", Version(2, 4, 0)),
        ("2.4.0-rc.1", Version(2, 4, 0, (0, ((1, 0, "rc"), (0, 1, ""))))),
        ("v2.5.4+build7", Version(2, 5, 4)),
    ],
)
def test_versions_as_servers_report_them(text: str, expected: Version) -> None:
    assert Version.parse(text) == expected


def test_a_pre_release_sorts_before_its_release_and_after_the_one_before() -> None:
    rc1, rc2 = Version.parse("2.4.0-rc.1"), Version.parse("v2.4.0-rc.2")
    assert rc1 is not None and rc2 is not None
    assert Version(2, 3, 99) < rc1 < rc2 < Version(2, 4, 0) < Version(2, 4, 1)
    assert Version.parse("2.4.0-beta") is not None
    assert str(rc1) == "2.4.0-rc.1"


@pytest.mark.parametrize("text", ["", "unknown", "milvus", "2", "latest"])
def test_a_version_that_is_not_one_is_unknown_and_refuses_nothing(text: str) -> None:
    target = target_of(text)
    assert target.kind == "milvus" and target.version is None
    # the check after creation (schema_check) decides there
    assert unholdable(schema_with("half", S.Float16Vector), target) == []


def test_milvus_lite_is_told_by_its_version_answer() -> None:
    lite = target_of("milvus_lite-3.2.2")
    assert lite.kind == "lite"
    assert "Milvus Lite" in str(lite)


# type -> (its first release, the release just before)
FIRSTS = {
    S.Float16Vector: ("2.4.0-rc.1", "v2.3.5"),
    S.BFloat16Vector: ("2.4.0-rc.1", "v2.3.21"),
    S.SparseFloatVector: ("v2.4.0", "v2.3.5"),
    S.Int8Vector: ("v2.6.0", "v2.5.14"),
    S.Geometry: ("v2.6.4", "v2.6.3"),
    S.Timestamptz: ("v2.6.6", "v2.6.5"),
}


@pytest.mark.parametrize("data_type", list(FIRSTS), ids=S.DataType.Name)
def test_each_type_is_refused_below_its_first_release_and_held_from_it(data_type: int) -> None:
    first, before = FIRSTS[data_type]
    schema = schema_with("f", data_type)
    name = S.DataType.Name(data_type)
    assert unholdable(schema, target_of(first)) == []
    assert unholdable(schema, target_of("v3.0.0")) == []  # newer: holds every known type
    (lost,) = unholdable(schema, target_of(before))
    assert lost.startswith(f"f ({name}") and "held from Milvus" in lost


@pytest.mark.parametrize(
    ("flags", "word", "first", "before"),
    [
        ({"nullable": True}, "nullable", "v2.5.0", "v2.4.15"),
        ({"is_partition_key": True}, None, "v2.3.0", None),
    ],
)
def test_flags_are_decided_by_release(
    flags: dict[str, object], word: str | None, first: str, before: str | None
) -> None:
    schema = schema_with("k", S.Int64, **flags)
    assert unholdable(schema, target_of(first)) == []
    if before is not None:
        (lost,) = unholdable(schema, target_of(before))
        assert word is not None and word in lost


def test_a_default_value_is_held_by_2_3_and_a_clustering_key_only_warned() -> None:
    schema = schema_with("d", S.Int64, is_clustering_key=True)
    schema.fields[-1].default_value.long_data = 7
    assert unholdable(schema, target_of("v2.3.5")) == []


def test_a_bm25_function_is_named_with_its_output_field() -> None:
    schema = schema_with("text", S.VarChar)
    schema.fields.add(fieldID=103, name="sparse", data_type=S.SparseFloatVector)
    schema.functions.add(
        name="bm25fn", type=S.BM25, input_field_names=["text"], output_field_names=["sparse"]
    )
    lost = "; ".join(unholdable(schema, target_of("v2.4.5")))
    for word in ("sparse", "bm25fn", "BM25"):
        assert word in lost, lost
    assert unholdable(schema, target_of("v2.5.0")) == []


def test_an_array_of_struct_and_the_dynamic_field() -> None:
    schema = schema_with("n", S.Int64)
    struct = schema.struct_array_fields.add(fieldID=200, name="chunks")
    struct.fields.add(fieldID=201, name="chunks[text]", data_type=S.Array)
    (lost,) = unholdable(schema, target_of("v2.6.3"))
    assert lost.startswith("chunks (ArrayOfStruct")
    assert unholdable(schema, target_of("v2.6.4")) == []
    schema.enable_dynamic_field = True
    assert unholdable(schema, target_of("v2.3.5")) == [lost]


def test_lite_refuses_by_name_what_it_cannot_hold_and_kafka_nothing() -> None:
    lite = target_of("milvus_lite-3.2.2")
    for data_type in (S.BinaryVector, S.Float16Vector, S.BFloat16Vector, S.Int8Vector):
        (lost,) = unholdable(schema_with("v", data_type), lite)
        assert S.DataType.Name(data_type) in lost and "Milvus Lite" in lost
    for data_type in (S.SparseFloatVector, S.Geometry, S.Timestamptz, S.JSON):
        assert unholdable(schema_with("v", data_type), lite) == []
        assert unholdable(schema_with("v", data_type), KAFKA) == []
    assert unholdable(schema_with("v", S.Int8Vector), KAFKA) == []


def test_the_refusal_names_collection_field_type_and_target() -> None:
    schema = schema_with("half", S.Float16Vector)
    schema.fields.add(fieldID=103, name="brain", data_type=S.BFloat16Vector)
    with pytest.raises(TaskFailedError) as caught:
        require_holdable("db.c", schema, target_of("v2.3.5"))
    message = str(caught.value)
    for word in ("collection db.c", "Milvus 2.3.5", "half (Float16Vector", "brain (BFloat16"):
        assert word in message, message
    assert "not created" in message
    require_holdable("db.c", schema, target_of("v2.4.0"))


def test_every_feature_names_where_its_fact_comes_from() -> None:
    assert all(feature.source for feature in FEATURES)
    assert Target("milvus", Version(2, 4, 0)).version == Version.parse("v2.4.0")


def test_the_docs_table_is_the_one_the_engine_renders() -> None:
    text = TABLE_PAGE.read_text(encoding="utf-8")
    assert MATRIX_BEGIN in text and MATRIX_END in text, f"{TABLE_PAGE} has no target-matrix block"
    start = text.index(MATRIX_BEGIN)
    block = text[start : text.index(MATRIX_END, start) + len(MATRIX_END)]
    assert block == render_matrix(), (
        "docs/reference/target-versions.md's table differs from "
        "replicator/sinks/target_capabilities.py; regenerate it: python scripts/gen_docs.py"
    )


class _Recorded(MilvusTarget):
    """A MilvusTarget whose calls are recorded and answered here (no channel)."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.calls: list[str] = []

    def _call(self, method: str, request: object, what: str) -> object:
        self.calls.append(method)
        if method == "GetVersion":
            return milvus_pb2.GetVersionResponse(version=self.version)
        if method == "HasCollection":
            return milvus_pb2.BoolResponse(value=False)
        raise AssertionError(f"unexpected call {method}")


def test_a_target_that_cannot_hold_the_schema_gets_no_create_call() -> None:
    target = _Recorded("v2.3.5")
    with pytest.raises(TaskFailedError, match=r"collection default\.c: .*half \(Float16Vector"):
        target.create_collection("default", "c", schema_with("half", S.Float16Vector), 1)
    assert target.calls == ["HasCollection", "GetVersion"]
    with pytest.raises(TaskFailedError):
        target.create_collection("default", "d", schema_with("brain", S.BFloat16Vector), 1)
    # asked at every DDL: a server replaced behind the address answers with its own version
    assert target.calls == ["HasCollection", "GetVersion"] * 2
    assert "CreateCollection" not in target.calls
