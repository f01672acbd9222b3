"""The digest of a query answer read as columns (protobuf ``FieldData``), equal to
``digest.digest_rows`` of the rows pymilvus would make of it, without making them.

pymilvus turns every answer into one dict per row, field by field; for a verify that is most of
the CPU (the backfill measured the same for its copy, ``backfill/columns.py``). Here each
field's column is turned into the encoded parts of ``digest.encode_row`` at once (fixed-width
fields with numpy: the length-prefixed name and tag, then the value bytes, one block of rows),
and each row is only the join of its fields' parts, hashed with BLAKE2b as ``digest.row_hash``
does. The encodings are the same bytes, so a range digested as columns on one side and as rows
on the other is still compared exactly.

The dynamic field (``$meta``, a JSON object per row) is merged as pymilvus merges it: each of its
keys that is not a field of the schema becomes a field of the row, encoded as JSON; a row whose
object is empty costs nothing more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pymilvus import DataType
from pymilvus.client.entity_helper import extract_struct_array_from_column_data

from replicator.codec.wkb import wkb_to_wkt
from replicator.compare.digest import (
    BYTE_VECTOR_KINDS,
    FLOAT_KINDS,
    HASH_BYTES,
    INT_KINDS,
    LENGTH,
    MOD,
    TEXT_KINDS,
    Digest,
    FieldKinds,
    UnsupportedValueError,
    encode_value,
)

# a column's encoded parts, one per row: the bytes ``digest.encode_row`` writes for the field
Parts = list[bytes]
EMPTY_JSON = (b"", b"{}")
_VECTORS = {"FLOAT_VECTOR", "SPARSE_FLOAT_VECTOR", *BYTE_VECTOR_KINDS}


def _header(name: str, tag: bytes) -> bytes:
    encoded = name.encode()
    return LENGTH.pack(len(encoded)) + encoded + tag


def _fixed(name: str, tag: bytes, values: np.ndarray) -> Parts:
    """Parts of a fixed-width column: ``values`` is (rows, width) uint8."""
    rows, width = values.shape
    prefix = np.frombuffer(_header(name, tag) + LENGTH.pack(width), dtype=np.uint8)
    block = np.empty((rows, len(prefix) + width), dtype=np.uint8)
    block[:, : len(prefix)] = prefix
    block[:, len(prefix) :] = values
    step = block.shape[1]
    data = block.tobytes()
    return [data[i : i + step] for i in range(0, len(data), step)]


def _as_rows(array: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint8).reshape(rows, -1)


def _variable(name: str, tag: bytes, values: Sequence[bytes]) -> Parts:
    header = _header(name, tag)
    pack = LENGTH.pack
    return [header + pack(len(v)) + v for v in values]


def _sparse(content: bytes) -> bytes:
    pairs = np.frombuffer(content, dtype=[("i", "<u4"), ("v", "<f4")])
    ordered = pairs[np.argsort(pairs["i"], kind="stable")]
    return ordered["i"].tobytes() + ordered["v"].tobytes()


def _array_cells(field: Any) -> list[Any]:
    cells = field.scalars.array_data.data
    out = []
    for cell in cells:
        attr = cell.WhichOneof("data")
        out.append(list(getattr(cell, attr).data) if attr else [])
    return out


def _byte_width(kind: str, dim: int) -> int:
    if kind == "BINARY_VECTOR":
        return dim // 8
    if kind in ("FLOAT16_VECTOR", "BFLOAT16_VECTOR"):
        return dim * 2
    return dim  # INT8_VECTOR


def _byte_vectors(kind: str, field: Any) -> bytes:
    vectors = field.vectors
    if kind == "BINARY_VECTOR":
        return bytes(vectors.binary_vector)
    if kind == "FLOAT16_VECTOR":
        return bytes(vectors.float16_vector)
    if kind == "BFLOAT16_VECTOR":
        return bytes(vectors.bfloat16_vector)
    return bytes(vectors.int8_vector)


def _values(kind: str, field: Any) -> list[Any]:
    """A column's values one per row, as pymilvus decodes them."""
    scalars = field.scalars
    if kind == "BOOL":
        return list(scalars.bool_data.data)
    if kind in ("INT8", "INT16", "INT32"):
        return list(scalars.int_data.data)
    if kind == "INT64":
        return list(scalars.long_data.data)
    if kind == "FLOAT":
        return list(scalars.float_data.data)
    if kind == "DOUBLE":
        return list(scalars.double_data.data)
    if kind in TEXT_KINDS:
        return list(scalars.string_data.data)
    if kind == "JSON":
        return [json.loads(raw) for raw in scalars.json_data.data]
    if kind == "ARRAY":
        return _array_cells(field)
    if kind == "TIMESTAMPTZ":  # a server answers text (Milvus Lite: ISO 8601) or the number
        if scalars.HasField("timestamptz_data"):
            return list(scalars.timestamptz_data.data)
        return list(scalars.string_data.data)
    if kind == "GEOMETRY":  # answered as WKT; WKB is what a WAL holds
        if scalars.HasField("geometry_data"):
            return [wkb_to_wkt(raw) if raw else None for raw in scalars.geometry_data.data]
        if scalars.HasField("geometry_wkt_data"):
            return list(scalars.geometry_wkt_data.data)
        return list(scalars.string_data.data)
    raise UnsupportedValueError(f"a column of {kind} value by value")


def _per_row(name: str, kind: str, values: Sequence[Any], valid: Sequence[bool]) -> Parts:
    """Parts of a column encoded value by value (``None`` and rows not ``valid``: null)."""
    parts = []
    for i, value in enumerate(values):
        tag, data = encode_value(kind, value if not valid or valid[i] else None)
        parts.append(_header(name, tag) + LENGTH.pack(len(data)) + data)
    return parts


def column_parts(name: str, kind: str, field: Any, rows: int) -> Parts:
    """The encoded parts (``digest.encode_row``'s bytes for this field) of every row of a
    column."""
    valid = list(field.valid_data)
    if field.WhichOneof("field") == "struct_arrays":
        # an Array of Struct: each row's list of objects as pymilvus gives it a query's rows
        # (sub-fields by their short names), so the digest is the one of those rows
        structs = [
            extract_struct_array_from_column_data(field.struct_arrays, i) for i in range(rows)
        ]
        return _per_row(name, kind, structs, ())
    if kind in _VECTORS:
        return _vector_parts(name, kind, field, valid)
    if valid or kind in ("JSON", "ARRAY", "TIMESTAMPTZ", "GEOMETRY"):
        # JSON "null" is a null, as pymilvus decodes it
        return _per_row(name, kind, _values(kind, field), valid)
    scalars = field.scalars
    if kind == "BOOL":
        values = np.array(scalars.bool_data.data, dtype=np.uint8).reshape(rows, 1)
        return _fixed(name, b"b", values)
    if kind in INT_KINDS:
        data = scalars.long_data.data if kind == "INT64" else scalars.int_data.data
        return _fixed(name, b"i", _as_rows(np.array(data, dtype="<i8"), rows))
    if kind in FLOAT_KINDS:
        data = scalars.float_data.data if kind == "FLOAT" else scalars.double_data.data
        # a float32 widens exactly, as pymilvus's Python float of it does
        return _fixed(name, b"d", _as_rows(np.array(data, dtype="<f8"), rows))
    if kind in TEXT_KINDS:
        return _variable(name, b"s", [s.encode() for s in scalars.string_data.data])
    raise UnsupportedValueError(f"a column of {kind}")


def _vector_parts(name: str, kind: str, field: Any, valid: Sequence[bool] = ()) -> Parts:
    """The parts of a vector column. A nullable one (``valid``) holds a vector for each valid
    row only, or one for every row: either way a row not valid is a null."""
    vectors = field.vectors
    parts: Parts
    if kind == "FLOAT_VECTOR":
        floats = np.array(vectors.float_vector.data, dtype="<f4")
        held = len(floats) // max(1, vectors.dim)
        parts = _fixed(name, b"v", _as_rows(floats, held)) if held else []
    elif kind in BYTE_VECTOR_KINDS:
        width = _byte_width(kind, vectors.dim)
        raw = np.frombuffer(_byte_vectors(kind, field), dtype=np.uint8)
        held = len(raw) // max(1, width)
        parts = _fixed(name, b"x", raw.reshape(held, width)) if held else []
    else:  # SPARSE_FLOAT_VECTOR
        parts = _variable(name, b"p", [_sparse(c) for c in vectors.sparse_float_vector.contents])
    if not valid:
        return parts
    tag, data = encode_value(kind, None)
    null = _header(name, tag) + LENGTH.pack(len(data)) + data
    if len(parts) == len(valid):
        return [part if ok else null for part, ok in zip(parts, valid, strict=True)]
    if len(parts) != sum(valid):
        raise UnsupportedValueError(
            f"a nullable {kind} column of {len(parts)} vectors for {sum(valid)} valid rows"
        )
    held_parts = iter(parts)
    return [next(held_parts) if ok else null for ok in valid]


def _rows_of(field: Any) -> int:
    """How many rows a column holds."""
    if len(field.valid_data):
        return len(field.valid_data)
    if field.WhichOneof("field") == "struct_arrays":
        subs = field.struct_arrays.fields
        return _rows_of(subs[0]) if subs else 0
    scalars, vectors = field.scalars, field.vectors
    if field.HasField("scalars"):
        attr = scalars.WhichOneof("data")
        return len(getattr(scalars, attr).data) if attr else 0
    if field.HasField("vectors"):
        attr = vectors.WhichOneof("data")
        if attr == "float_vector":
            return int(len(vectors.float_vector.data) // max(1, vectors.dim))
        if attr == "sparse_float_vector":
            return len(vectors.sparse_float_vector.contents)
        if attr == "vector_array":  # a struct's sub-field of vectors: a cell per row
            return len(vectors.vector_array.data)
        if attr:
            width = _byte_width(_VECTOR_KIND[attr], vectors.dim)
            return int(len(getattr(vectors, attr)) // max(1, width))
    return 0


_VECTOR_KIND = {
    "binary_vector": "BINARY_VECTOR",
    "float16_vector": "FLOAT16_VECTOR",
    "bfloat16_vector": "BFLOAT16_VECTOR",
    "int8_vector": "INT8_VECTOR",
}


def _kind(field: Any, kinds: FieldKinds) -> str:
    known = kinds.get(field.field_name)
    return known if known is not None else DataType(field.type).name


def row_encodings(fields: Sequence[Any], kinds: FieldKinds) -> list[bytes]:
    """``digest.encode_row`` of every row of a query answer's columns, in the answer's row
    order."""
    static = [f for f in fields if not f.is_dynamic]
    dynamic = [f for f in fields if f.is_dynamic]
    if not static and not dynamic:
        return []
    rows = _rows_of(static[0] if static else dynamic[0])
    if not rows:
        return []
    ordered = sorted(static, key=lambda f: str(f.field_name))
    columns = [column_parts(f.field_name, _kind(f, kinds), f, rows) for f in ordered]
    for name, column in zip((f.field_name for f in ordered), columns, strict=True):
        if len(column) != rows:
            raise UnsupportedValueError(f"column {name} holds {len(column)} rows, not {rows}")
    joined = [b"".join(parts) for parts in zip(*columns, strict=True)] if columns else []
    if not dynamic:
        return joined
    names = [f.field_name for f in ordered]
    merge = _dynamic_merger(names, columns, kinds)
    meta = dynamic[0].scalars.json_data.data
    if not joined:
        joined = [b""] * rows
    return [
        joined[i] if meta[i] in EMPTY_JSON else merge(i, json.loads(meta[i])) for i in range(rows)
    ]


def _dynamic_merger(
    names: list[str], columns: list[Parts], kinds: FieldKinds
) -> Callable[[int, Any], bytes]:
    """Row ``i``'s encoding with the keys of its dynamic object that are not fields."""
    fields = set(names)

    def merge(i: int, extra: Any) -> bytes:
        parts = [(name, column[i]) for name, column in zip(names, columns, strict=True)]
        if isinstance(extra, dict):
            for key, value in extra.items():
                if key in fields:
                    continue
                tag, data = encode_value(kinds.get(key, "JSON"), value)
                parts.append((key, _header(key, tag) + LENGTH.pack(len(data)) + data))
        parts.sort(key=lambda part: part[0])
        return b"".join(part for _, part in parts)

    return merge


def columns_digest(fields: Sequence[Any], kinds: FieldKinds) -> Digest:
    """The digest of the rows of a query answer's columns: ``digest.digest_rows`` of them."""
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    encodings = row_encodings(fields, kinds)
    total = sum(
        from_bytes(blake2b(e, digest_size=HASH_BYTES).digest(), "little") for e in encodings
    )
    return Digest(len(encodings), total % MOD)
