"""The collections of test_field_types.py: every field type a Milvus 2.3.5 source holds, with
edge values, and a comparison field by field that reads neither side with the daemon's code.

Four collections (2.3.5 allows one vector field per collection):

- ``every``: int64 key, float vector, Bool, Int8..Int64, Float, Double, VarChar (unicode, empty,
  at max_length in bytes), JSON (nested, unicode, 2**53+1, -2**63, 2**64-1, floats), an Array of
  each element type 2.3.5 accepts, an Int64 and a VarChar with default values (some inserts omit
  them: the source fills them), the dynamic field (keys outside the schema; some rows have none);
- ``bits``: varchar key (quotes, backslashes, spaces, unicode, NUL and control characters),
  binary vector, VarChar;
- ``auto``: auto_id int64 key (the target keeps the source's keys), float vector, Int32;
- ``tenants``: a partition key (VarChar, 4 partitions), float vector, JSON.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient

DIM = 8
BITS_DIM = 32  # 4 bytes a row
TEXT_MAX = 16  # max_length of the VarChar fields (bytes)
ELEMENT_MAX = 8  # max_length of the VarChar array's elements
CAPACITY = 4  # max_capacity of the arrays
DEFAULT_N = 7  # default value of ``every.dflt``
DEFAULT_TEXT = "défaut"  # default value of ``every.dtext``

Key = int | str
Row = dict[str, Any]

ARRAY_TYPES = {
    "a_bool": DataType.BOOL,
    "a_i8": DataType.INT8,
    "a_i16": DataType.INT16,
    "a_i32": DataType.INT32,
    "a_i64": DataType.INT64,
    "a_f32": DataType.FLOAT,
    "a_f64": DataType.DOUBLE,
    "a_text": DataType.VARCHAR,
}

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
EDGE_JSON = {
    "big": 2**53 + 1,
    "min": -(2**63),
    "max": 2**63 - 1,
    "u64": 2**64 - 1,
    "pi": 3.141592653589793,
    "tiny": 5e-324,
    "huge": 1.7976931348623157e308,
    "neg": -0.5,
    "yes": True,
    "nothing": None,
    "text": '漢字 "quoted" \\ 🙂',
    "ключ": "значение",
    "nested": {"a": [1, [2, {"b": "c"}]], "empty": {}, "list": []},
    "": "an empty key",
    "nul\x00key": "nul\x00value\n\t\u2028",
}
# per edge row (ids 0..3): extremes of every scalar type
EDGES: list[Row] = [
    {
        "i8": -128,
        "i16": -32768,
        "i32": -(2**31),
        "i64": -(2**63),
        "f32": F32_MAX,
        "f64": 1.7976931348623157e308,
        "text": "",
        "doc": EDGE_JSON,
    },
    {
        "i8": 127,
        "i16": 32767,
        "i32": 2**31 - 1,
        "i64": 2**63 - 1,
        "f32": -F32_TINY,
        "f64": 5e-324,
        "text": "x" * TEXT_MAX,
        "doc": {"list": [2**53 + 1, -(2**63), 0.1, "é"]},
    },
    {
        "i8": 0,
        "i16": 0,
        "i32": 0,
        "i64": 0,
        "f32": 1 / 3,
        "f64": -1 / 3,
        "text": "🙂" * (TEXT_MAX // 4),  # at max_length in bytes, 4 characters
        "doc": {},
    },
    {
        "i8": -1,
        "i16": -1,
        "i32": -1,
        "i64": 2**53 + 1,
        "f32": -0.0,
        "f64": 0.1,
        "text": "é" * (TEXT_MAX // 2),
        "doc": {"deep": {"deeper": {"deepest": [{"x": [None, False, -1.5e-7]}]}}},
    },
]
EDGE_ARRAYS: list[Row] = [
    {
        "a_bool": [True, False, True, False],
        "a_i8": [-128, 127, 0, -1],
        "a_i16": [-32768, 32767],
        "a_i32": [-(2**31), 2**31 - 1],
        "a_i64": [-(2**63), 2**63 - 1, 2**53 + 1],
        "a_f32": [F32_MAX, -F32_TINY, 1 / 3, 0.0],
        "a_f64": [1.7976931348623157e308, 5e-324, -1 / 3],
        "a_text": ["", "é", "🙂🙂", "x" * ELEMENT_MAX],
    },
    {name: [] for name in ARRAY_TYPES},  # every array empty
]


def vector(rnd: random.Random) -> list[float]:
    return [rnd.uniform(-1, 1) for _ in range(DIM)]


def every_row(i: int, tag: str, *, default: bool = True) -> Row:
    """Row ``i`` of ``every``; ``default=False`` leaves out ``dflt`` (the source fills it)."""
    rnd = random.Random(f"{tag}-{i}")
    row: Row = {
        "id": i,
        "vec": vector(rnd),
        "flag": i % 2 == 0,
        "i8": i % 256 - 128,
        "i16": i * 211 % 65536 - 32768,
        "i32": i * 1_000_003 % 2**32 - 2**31,
        "i64": i * 10**15 + 2**53,
        "f32": rnd.uniform(-1e6, 1e6),
        "f64": rnd.uniform(-1e12, 1e12),
        "text": f"{tag} é{i}"[:TEXT_MAX] if i % 10 != 4 else f"\x00{tag[:3]}\n{i}\t",
        "doc": {"n": i, "tag": tag, "tags": ["a", str(i)], "nested": {"ok": i % 3 == 0}},
        "a_bool": [i % 2 == 0, i % 3 == 0],
        "a_i8": [i % 100, -(i % 100)],
        "a_i16": [i * 7 % 32768, -(i % 32768)],
        "a_i32": [i * 70_000],
        "a_i64": [i * 10**12, -(i + 1)],
        "a_f32": [rnd.uniform(-1, 1) for _ in range(3)],
        "a_f64": [i / 7, rnd.uniform(-1e100, 1e100)],
        "a_text": [f"{tag[:3]}{i}", "ü"],
    }
    if i < len(EDGES):
        row.update(EDGES[i])
    if i < len(EDGE_ARRAYS):
        row.update(EDGE_ARRAYS[i])
    if default:
        row.update({"dflt": -i, "dtext": f"given {i}"})
    if i % 3 == 0:  # the dynamic field: keys outside the schema
        row.update({"note": f"{tag} ü {i}", "extra": {"k": [i, 2**53 + 1]}, "ratio": i / 7})
    elif i % 3 == 1:
        row["note"] = f"only a note {i}"
    return row


def bits_key(n: int) -> str:
    marks = ['"', "\\", " ", "é", "中", "🙂", "'", "\x00\n\t"]  # escaped in expressions
    return f"{marks[n % len(marks)]}k{n:04d}{marks[(n // 8) % len(marks)]}"


def bits_row(n: int, tag: str) -> Row:
    rnd = random.Random(f"{tag}-{n}")
    return {
        "key": bits_key(n),
        "bits": bytes(rnd.randrange(256) for _ in range(BITS_DIM // 8)),
        "note": f"{tag} {n} ☃"[:TEXT_MAX],
    }


def auto_row(n: int, tag: str) -> Row:
    return {"vec": vector(random.Random(f"{tag}-{n}")), "n": n * 3 - 100}


def tenant_row(i: int, tag: str) -> Row:
    rnd = random.Random(f"{tag}-{i}")
    return {
        "id": i,
        "vec": vector(rnd),
        "tenant": f"t{(i * 7 + len(tag)) % 5}",
        "doc": {"tag": tag, "i": i},
    }


def create_collections(client: MilvusClient, names: Mapping[str, str]) -> None:
    """The four collections, each with an index (a query needs one on 2.3.5)."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("flag", DataType.BOOL)
    schema.add_field("i8", DataType.INT8)
    schema.add_field("i16", DataType.INT16)
    schema.add_field("i32", DataType.INT32)
    schema.add_field("i64", DataType.INT64)
    schema.add_field("f32", DataType.FLOAT)
    schema.add_field("f64", DataType.DOUBLE)
    schema.add_field("text", DataType.VARCHAR, max_length=TEXT_MAX)
    schema.add_field("doc", DataType.JSON)
    for name, element in ARRAY_TYPES.items():
        extra = {"max_length": ELEMENT_MAX} if element == DataType.VARCHAR else {}
        schema.add_field(name, DataType.ARRAY, element_type=element, max_capacity=CAPACITY, **extra)
    schema.add_field("dflt", DataType.INT64, default_value=DEFAULT_N)
    schema.add_field("dtext", DataType.VARCHAR, max_length=TEXT_MAX, default_value=DEFAULT_TEXT)
    _create(client, names["every"], schema, "vec", "FLAT", "L2")

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=32)
    schema.add_field("bits", DataType.BINARY_VECTOR, dim=BITS_DIM)
    schema.add_field("note", DataType.VARCHAR, max_length=TEXT_MAX * 2)
    _create(client, names["bits"], schema, "bits", "BIN_FLAT", "HAMMING")

    schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True, auto_id=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("n", DataType.INT32)
    _create(client, names["auto"], schema, "vec", "FLAT", "L2")

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("tenant", DataType.VARCHAR, max_length=8, is_partition_key=True)
    schema.add_field("doc", DataType.JSON)
    _create(client, names["tenants"], schema, "vec", "FLAT", "L2", num_partitions=4)


def _create(
    client: MilvusClient, name: str, schema: Any, vec: str, kind: str, metric: str, **kw: Any
) -> None:
    index = client.prepare_index_params()
    index.add_index(vec, index_type=kind, metric_type=metric)
    client.create_collection(name, schema=schema, index_params=index, **kw)


@dataclass
class Written:
    """What the test wrote: every key ever written per collection (alive or deleted)."""

    keys: dict[str, set[Key]] = field(default_factory=dict)
    deleted: dict[str, set[Key]] = field(default_factory=dict)

    def alive(self, name: str) -> set[Key]:
        return self.keys[name] - self.deleted[name]


def write_all(client: MilvusClient, names: Mapping[str, str], start: int = 0) -> Written:
    """Inserts (three a collection, so records of one channel between two ticks reach the target
    as one merged write), upserts and deletes; keys from ``start``."""
    written = Written({n: set() for n in names.values()}, {n: set() for n in names.values()})
    every, bits, auto, tenants = (names[k] for k in ("every", "bits", "auto", "tenants"))
    s = start
    for chunk, default in ((range(s, s + 40), True), (range(s + 40, s + 70), False)):
        client.insert(every, [every_row(i, "ins", default=default) for i in chunk])
        client.insert(bits, [bits_row(n, "ins") for n in chunk])
        client.insert(tenants, [tenant_row(i, "ins") for i in chunk])
        made = client.insert(auto, [auto_row(n, "ins") for n in chunk])
        written.keys[auto].update(made["ids"])
        written.keys[every].update(chunk)
        written.keys[bits].update(bits_key(n) for n in chunk)
        written.keys[tenants].update(chunk)
    chunk = range(s + 70, s + 90)
    client.insert(every, [every_row(i, "ins") for i in chunk])
    client.insert(bits, [bits_row(n, "ins") for n in chunk])
    written.keys[every].update(chunk)
    written.keys[bits].update(bits_key(n) for n in chunk)
    # upserts: new values (other dynamic keys, another tenant), and a key not there before
    upserted = [*range(s + 10, s + 20), s + 95]
    client.upsert(every, [every_row(i, "upsert") for i in upserted[:-1]])
    client.upsert(every, [every_row(s + 95, "upsert", default=False)])  # filled by the source
    client.upsert(bits, [bits_row(n, "upsert") for n in upserted])
    client.upsert(tenants, [tenant_row(i, "upsert-moved") for i in upserted])
    written.keys[every].add(s + 95)
    written.keys[bits].add(bits_key(s + 95))
    written.keys[tenants].add(s + 95)
    # deletes: by filter and by key; keys holding quotes and backslashes among them
    client.delete(every, filter=f"id in [{s + 5}, {s + 6}, {s + 7}]")
    client.delete(every, ids=[s + 30, s + 31])
    gone_bits = [bits_key(n) for n in (s + 8, s + 9, s + 15, s + 16, s + 17, s + 33, s + 39)]
    # (pymilvus's ``ids=`` puts varchar keys into the expression unescaped)
    client.delete(bits, filter=f"key in [{', '.join(expr_literal(k) for k in gone_bits)}]")
    client.delete(tenants, ids=[s + 2, s + 12])
    gone_auto = sorted(written.keys[auto])[:5]
    client.delete(auto, ids=gone_auto)
    written.deleted[every].update([s + 5, s + 6, s + 7, s + 30, s + 31])
    written.deleted[bits].update(gone_bits)
    written.deleted[tenants].update([s + 2, s + 12])
    written.deleted[auto].update(gone_auto)
    return written


# --- reading and comparing ---------------------------------------------------------------------
def expr_literal(key: Key) -> str:
    """A key in a Milvus expression, escaped by JSON's rules (written here, not taken from the
    daemon, so the check does not share its escaping)."""
    return str(key) if isinstance(key, int) else json.dumps(key, ensure_ascii=False)


@dataclass(frozen=True)
class Kinds:
    """A collection's fields as the source describes them: name -> (type, element type)."""

    pk: str
    fields: dict[str, tuple[DataType, DataType | None]]


def kinds_of(client: MilvusClient, collection: str) -> Kinds:
    described = client.describe_collection(collection)
    fields = {f["name"]: (f["type"], f.get("element_type")) for f in described["fields"]}
    pk = next(f["name"] for f in described["fields"] if f.get("is_primary"))
    return Kinds(pk, fields)


def read_rows(client: MilvusClient, collection: str, pk: str, keys: Iterable[Key]) -> dict:
    """Every row of ``keys`` (asked by key, ``in [...]``, every field and dynamic key), checked
    against ``count(*)``: a row on this side the test did not write fails the read."""
    client.load_collection(collection, timeout=60)
    wanted = sorted(keys, key=str)
    found: dict[Key, Row] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        expr = f"{pk} in [{', '.join(expr_literal(k) for k in chunk)}]"
        for row in client.query(
            collection, filter=expr, output_fields=["*"], consistency_level="Strong", timeout=30
        ):
            assert row[pk] not in found, f"{collection}: key {row[pk]!r} twice"
            found[row[pk]] = row
    total = client.query(
        collection, filter="", output_fields=["count(*)"], consistency_level="Strong"
    )[0]["count(*)"]
    assert total == len(found), f"{collection}: count(*) {total}, rows of written keys {len(found)}"
    return found


def _canonical(value: Any) -> str:
    """JSON with sorted keys: 1, 1.0 and true stay different (Python's == would not)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _f32(values: Any) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def _binary(value: Any) -> bytes:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], bytes):
        return value[0]  # pymilvus answers a binary vector as [bytes]
    if isinstance(value, str):
        return base64.b64decode(value)  # a Kafka event: base64 of the bytes
    return bytes(value)


def _as_floats(value: Any) -> list[float]:
    return [float(x) for x in value]


Comparer = Callable[[Any], Any]
_BY_TYPE: dict[DataType, Comparer] = {
    DataType.FLOAT: lambda v: _f32([v]),  # float32 precision: the same float32
    DataType.FLOAT_VECTOR: lambda v: _f32(_as_floats(v)),
    DataType.BINARY_VECTOR: _binary,
    DataType.DOUBLE: lambda v: (type(v).__name__, float(v).hex()),
}


def comparable(kind: tuple[DataType, DataType | None] | None, value: Any) -> Any:
    """A value reduced to what must be equal on both sides: float32 bytes of floats, bytes of
    binary vectors, canonical JSON of JSON values, dynamic keys and arrays (a float array's
    elements as float32), the value and its Python type otherwise (True is not 1)."""
    if kind is None:  # a dynamic key
        return ("dynamic", _canonical(value))
    data_type, element = kind
    if data_type in _BY_TYPE:
        return _BY_TYPE[data_type](value)
    if data_type == DataType.ARRAY and element == DataType.FLOAT:
        return ("float32 array", _f32(_as_floats(value)))
    if data_type in (DataType.JSON, DataType.ARRAY):
        return (data_type.name, _canonical(value))
    return (type(value).__name__, value)


def differences(
    kinds: Kinds, collection: str, expected: Mapping[Key, Row], actual: Mapping[Key, Row]
) -> list[str]:
    """Every difference, named by collection, key, field and type ([] when equal)."""
    found = [f"{collection}: key {k!r} missing" for k in expected if k not in actual]
    found += [f"{collection}: key {k!r} extra" for k in actual if k not in expected]
    for key in sorted(set(expected) & set(actual), key=str):
        want, got = expected[key], actual[key]
        for name in sorted(set(want) | set(got)):
            kind = kinds.fields.get(name)
            type_name = "dynamic" if kind is None else kind[0].name
            if name not in got or name not in want:
                side = "target" if name not in got else "source"
                found.append(f"{collection}: key {key!r} field {name} ({type_name}) not on {side}")
            elif comparable(kind, want[name]) != comparable(kind, got[name]):
                found.append(
                    f"{collection}: key {key!r} field {name} ({type_name}): "
                    f"source {want[name]!r}, target {got[name]!r}"
                )
    return found


# --- schemas -----------------------------------------------------------------------------------
def _default_of(field: Mapping[str, Any]) -> Any:
    """A described field's default value as a plain value (None when it has none)."""
    default = field.get("default_value")
    if default is None:
        return None
    kind = default.WhichOneof("data")
    return getattr(default, kind) if kind else None


def _type_name(value: Any) -> str | None:
    """A pymilvus DataType as the protobuf enum's name ("Int64"), as the events name it."""
    from pymilvus.grpc_gen import schema_pb2

    return None if value is None else schema_pb2.DataType.Name(int(value))


def schema_shape(client: MilvusClient, collection: str, *, auto_id: bool = True) -> dict:
    """What a user sees of a schema: each field's type, element type, parameters, default
    value, key flags; dynamic or not; the partitions of a partition key. ``auto_id=False``
    leaves out auto_id (the target's keys are the source's: it is off there on purpose)."""
    described = client.describe_collection(collection)
    fields = [
        {
            "name": f["name"],
            "type": _type_name(f["type"]),
            "element_type": _type_name(f.get("element_type")),
            "params": {k: str(v) for k, v in f.get("params", {}).items()},
            "default": _default_of(f),
            "primary": bool(f.get("is_primary")),
            "partition_key": bool(f.get("is_partition_key")),
            **({"auto_id": bool(f.get("auto_id"))} if auto_id else {}),
        }
        for f in described["fields"]
    ]
    return {
        "fields": fields,
        "dynamic": bool(described.get("enable_dynamic_field")),
        "partitions": described.get("num_partitions"),
    }


def event_schema_shape(event: Mapping[str, Any]) -> dict:
    """The same of a Kafka ``create_collection`` event (README, "Kafka targets")."""
    fields = [
        {
            "name": f["name"],
            "type": f["type"],
            "element_type": f.get("element_type"),
            "params": f.get("params", {}),
            "default": f.get("default_value"),
            "primary": bool(f.get("primary_key")),
            "partition_key": bool(f.get("is_partition_key")),
        }
        for f in event["schema"]["fields"]
    ]
    return {"fields": fields, "dynamic": bool(event["schema"]["enable_dynamic_field"])}


def schema_differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Each field (or property) that differs, as "name: expected != actual"."""
    found = [
        f"{key}: {expected[key]!r} != {actual.get(key)!r}"
        for key in expected
        if key != "fields" and expected[key] != actual.get(key)
    ]
    want = {f["name"]: f for f in expected["fields"]}
    got = {f["name"]: f for f in actual["fields"]}
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            found.append(f"field {name}: {want.get(name)!r} != {got.get(name)!r}")
    return found
