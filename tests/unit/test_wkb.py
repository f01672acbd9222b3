"""replicator/sinks/wkb.py against WKB written out byte by byte from the OGC layout (byte
order, uint32 type, doubles), in both byte orders and with Z, M, SRID and empties."""

from __future__ import annotations

import struct

import pytest
from pymilvus.grpc_gen import schema_pb2

from replicator.codec.wkb import WkbError, geometry_columns_as_wkt, wkb_to_wkt


def ndr(kind: int, *parts: bytes) -> bytes:
    return struct.pack("<BI", 1, kind) + b"".join(parts)


def xdr(kind: int, *parts: bytes) -> bytes:
    return struct.pack(">BI", 0, kind) + b"".join(parts)


def doubles(*values: float, end: str = "<") -> bytes:
    return struct.pack(f"{end}{len(values)}d", *values)


def count(n: int, end: str = "<") -> bytes:
    return struct.pack(f"{end}I", n)


@pytest.mark.parametrize(
    ("raw", "wkt"),
    [
        (ndr(1, doubles(1, 2)), "POINT (1 2)"),
        (xdr(1, doubles(-0.5, 1e-7, end=">")), "POINT (-0.5 0.0000001)"),
        (ndr(1, doubles(float("nan"), float("nan"))), "POINT EMPTY"),
        (ndr(1001, doubles(1, 2, 3)), "POINT Z (1 2 3)"),
        (ndr(0x80000001 | 0x20000000, count(4326), doubles(1, 2, 3)), "POINT Z (1 2 3)"),
        (ndr(3001, doubles(1, 2, 3, 4)), "POINT ZM (1 2 3 4)"),
        (ndr(2, count(2), doubles(0, 0, 1.25, 3)), "LINESTRING (0 0, 1.25 3)"),
        (ndr(2, count(0)), "LINESTRING EMPTY"),
        (
            ndr(3, count(1), count(4), doubles(0, 0, 4, 0, 4, 4, 0, 0)),
            "POLYGON ((0 0, 4 0, 4 4, 0 0))",
        ),
        (
            ndr(4, count(2), ndr(1, doubles(1, 2)), xdr(1, doubles(3, 4, end=">"))),
            "MULTIPOINT ((1 2), (3 4))",
        ),
        (
            ndr(7, count(2), ndr(1, doubles(1, 2)), ndr(2, count(2), doubles(0, 0, 1, 1))),
            "GEOMETRYCOLLECTION (POINT (1 2), LINESTRING (0 0, 1 1))",
        ),
        (ndr(1, doubles(0.1, 123456789.125)), "POINT (0.1 123456789.125)"),
    ],
)
def test_wkb_reads_as_the_wkt_it_encodes(raw: bytes, wkt: str) -> None:
    assert wkb_to_wkt(raw) == wkt


@pytest.mark.parametrize(
    "raw",
    [b"", ndr(1, doubles(1)), ndr(9, doubles(1, 2)), ndr(1, doubles(1, 2)) + b"\x00"],
)
def test_what_is_not_a_geometry_is_refused(raw: bytes) -> None:
    with pytest.raises(WkbError):
        wkb_to_wkt(raw)


def test_a_geometry_column_becomes_wkt_with_its_nulls_kept() -> None:
    column = schema_pb2.FieldData(field_name="g", type=schema_pb2.Geometry)
    column.scalars.geometry_data.data.extend([ndr(1, doubles(1, 2)), b""])
    column.valid_data.extend([True, False])
    other = schema_pb2.FieldData(field_name="s", type=schema_pb2.VarChar)
    other.scalars.string_data.data.append("x")
    geometry_columns_as_wkt([column, other], "db.c")
    assert list(column.scalars.geometry_wkt_data.data) == ["POINT (1 2)", ""]
    assert not column.scalars.HasField("geometry_data")
    assert list(column.valid_data) == [True, False]
    assert list(other.scalars.string_data.data) == ["x"]

    bad = schema_pb2.FieldData(field_name="where", type=schema_pb2.Geometry)
    bad.scalars.geometry_data.data.append(b"\x01\x09")
    with pytest.raises(WkbError, match=r"db\.c: field where \(Geometry\), row 0"):
        geometry_columns_as_wkt([bad], "db.c")
