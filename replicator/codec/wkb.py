"""Geometry columns from a 2.6 WAL, made writable: WKB (what the WAL holds) to WKT (what a
target's insert takes).

A Milvus 2.6 proxy turns the WKT a client inserts (``geometry_wkt_data``) into WKB before it
appends the Insert (``internal/proxy/validate_util.go`` ``checkGeometryFieldData``:
``wkb.Marshal(geom, wkb.NDR, ...)`` into ``geometry_data``; a default value is filled the same
way). Every target's insert reads ``geometry_wkt_data`` only (the same function on a 2.6 target;
Milvus Lite's ``fields_data_to_records``), so the column is turned back into WKT here.

The decoder follows the OGC Simple Features WKB layout: a byte-order byte (0 big endian, 1
little endian), a uint32 geometry type (1 Point ... 7 GeometryCollection; +1000 Z, +2000 M,
+3000 ZM, or the EWKB flags 0x80000000 Z, 0x40000000 M, 0x20000000 SRID followed by a uint32
SRID), then the coordinates as doubles. A point whose coordinates are all NaN is the empty
point (go-geom's ``EmptyPointHandlingNaN``). Numbers are written in the shortest positional
form that reads back as the same double, as Go's ``strconv.FormatFloat(x, 'f', -1, 64)``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
from pymilvus.grpc_gen import schema_pb2

_NAMES = {
    1: "POINT",
    2: "LINESTRING",
    3: "POLYGON",
    4: "MULTIPOINT",
    5: "MULTILINESTRING",
    6: "MULTIPOLYGON",
    7: "GEOMETRYCOLLECTION",
}
_EWKB_Z, _EWKB_M, _EWKB_SRID = 0x80000000, 0x40000000, 0x20000000


class WkbError(ValueError):
    """Bytes that are not a geometry this decoder reads."""


def _number(value: float) -> str:
    return str(np.format_float_positional(value, trim="-"))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, fmt: str) -> tuple[float | int, ...]:
        size = struct.calcsize(fmt)
        if self._at + size > len(self._data):
            raise WkbError(f"truncated at byte {self._at}")
        values = struct.unpack_from(fmt, self._data, self._at)
        self._at += size
        return values

    @property
    def done(self) -> bool:
        return self._at == len(self._data)

    def geometry(self) -> tuple[str, str]:
        """(type name with its dimension suffix, the body after the type name)."""
        order = int(self.take("B")[0])
        if order not in (0, 1):
            raise WkbError(f"byte order {order}")
        end = "<" if order == 1 else ">"
        code = int(self.take(end + "I")[0])
        has_z, has_m = bool(code & _EWKB_Z), bool(code & _EWKB_M)
        if code & _EWKB_SRID:
            self.take(end + "I")  # the SRID: WKT has no place for it
        code &= 0x0FFFFFFF
        base, iso = code % 1000, code // 1000
        has_z = has_z or iso in (1, 3)
        has_m = has_m or iso in (2, 3)
        if base not in _NAMES:
            raise WkbError(f"geometry type {code}")
        dims = 2 + has_z + has_m
        suffix = " ZM" if has_z and has_m else " Z" if has_z else " M" if has_m else ""
        return _NAMES[base] + suffix, self._body(base, end, dims)

    def _points(self, end: str, dims: int, count: int) -> list[str]:
        values = self.take(f"{end}{count * dims}d")
        return [
            " ".join(_number(float(v)) for v in values[i * dims : (i + 1) * dims])
            for i in range(count)
        ]

    def _count(self, end: str) -> int:
        (count,) = self.take(end + "I")
        return int(count)

    def _ring(self, end: str, dims: int) -> str:
        count = self._count(end)
        return "EMPTY" if count == 0 else "(" + ", ".join(self._points(end, dims, count)) + ")"

    def _body(self, base: int, end: str, dims: int) -> str:
        if base == 1:
            values = self.take(f"{end}{dims}d")
            if all(math.isnan(float(v)) for v in values):
                return "EMPTY"
            return "(" + " ".join(_number(float(v)) for v in values) + ")"
        if base == 2:
            return self._ring(end, dims)
        if base == 3:
            rings = [self._ring(end, dims) for _ in range(self._count(end))]
            return "(" + ", ".join(rings) + ")" if rings else "EMPTY"
        parts = []
        for _ in range(self._count(end)):
            name, body = self.geometry()
            parts.append(f"{name} {body}" if base == 7 else body)
        return "(" + ", ".join(parts) + ")" if parts else "EMPTY"


def wkb_to_wkt(data: bytes) -> str:
    """The WKT of one WKB geometry, e.g. ``POINT (1 2)``; raises :class:`WkbError`."""
    reader = _Reader(bytes(data))
    name, body = reader.geometry()
    if not reader.done:
        raise WkbError("bytes after the geometry")
    return f"{name} {body}"


def geometry_columns_as_wkt(columns: Sequence[schema_pb2.FieldData], where: str) -> None:
    """Rewrite, in place, every Geometry column of ``columns`` holding WKB (``geometry_data``)
    as WKT (``geometry_wkt_data``); a null row (``valid_data`` false) stays an empty string.
    An undecodable value raises :class:`WkbError` naming ``where``, the field and the row."""
    for column in columns:
        if column.type != schema_pb2.Geometry or not column.scalars.HasField("geometry_data"):
            continue
        valid = column.valid_data
        texts = []
        for row, raw in enumerate(column.scalars.geometry_data.data):
            if (len(valid) > row and not valid[row]) or not raw:
                texts.append("")
                continue
            try:
                texts.append(wkb_to_wkt(raw))
            except WkbError as exc:
                raise WkbError(
                    f"{where}: field {column.field_name} (Geometry), row {row}: "
                    f"undecodable WKB: {exc}"
                ) from None
        column.scalars.ClearField("geometry_data")
        column.scalars.geometry_wkt_data.data.extend(texts)
