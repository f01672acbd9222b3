"""An order-independent digest of a set of rows: proof that two sides hold the same rows.

A row's canonical encoding lists its fields sorted by name, each as its name, a one-byte type
tag and its value, every variable part length-prefixed, so no two different rows encode alike:

    int fields         signed 8 bytes, little endian     bool     one byte
    float, double      IEEE double of the value read (a float32 widens exactly)
    float vectors      float32 bytes, exactly as stored  varchar  UTF-8
    binary, float16,   the bytes as stored               JSON and dynamic fields, arrays:
    bfloat16 vectors                                     json.dumps(sort_keys=True), UTF-8
    sparse vectors     (index u32, value f32) pairs in index order
    timestamptz        UTC microseconds, signed 8 bytes (a server answers ISO 8601 text in
                       its own format and offset, or the number)
    geometry           WKT with its numbers written back from the doubles they read as and
                       single spaces ("POINT (1 2)" whatever the server's spacing or "1.0")

The digest of a set of rows is their count and the sum, mod 2**128, of a 128-bit BLAKE2b hash
of each encoding: adding is commutative, so the order rows are read in does not matter, and a
range can be digested page by page without holding its rows. The backfill shares it to prove a
copied range.

Fields are encoded by the kind the collection's schema gives them (``FieldKinds``); a field the
schema does not name (a dynamic field) is encoded as JSON.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

MOD = 1 << 128
HASH_BYTES = 16

# field name -> kind: a pymilvus DataType name ("INT64", "FLOAT_VECTOR", ...)
FieldKinds = Mapping[str, str]

INT_KINDS = {"INT8", "INT16", "INT32", "INT64"}
FLOAT_KINDS = {"FLOAT", "DOUBLE"}
TEXT_KINDS = {"VARCHAR", "STRING", "TEXT"}
BYTE_VECTOR_KINDS = {"BINARY_VECTOR", "FLOAT16_VECTOR", "BFLOAT16_VECTOR", "INT8_VECTOR"}
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
LENGTH = struct.Struct("<I")


class UnsupportedValueError(TypeError):
    """A value that does not fit its field's kind."""


def _json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_plain
    ).encode()


def _plain(value: Any) -> Any:
    """A value JSON has no type for, as a struct's sub-field of vectors holds it (pymilvus
    answers float16 and bfloat16 elements as numpy values, binary ones as bytes)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise UnsupportedValueError(f"a value of {type(value).__name__} in a JSON document")


def _vector_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], bytes):
        return value[0]  # pymilvus answers a binary vector as [bytes]
    if isinstance(value, np.ndarray):
        return value.tobytes()
    raise UnsupportedValueError(f"a byte vector as {type(value).__name__}")


def _sparse_bytes(value: Any) -> bytes:
    if not isinstance(value, Mapping):
        raise UnsupportedValueError(f"a sparse vector as {type(value).__name__}")
    pairs = sorted((int(k), float(v)) for k, v in value.items())
    indices = np.asarray([i for i, _ in pairs], dtype="<u4").tobytes()
    values = np.asarray([v for _, v in pairs], dtype="<f4").tobytes()
    return indices + values


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WKT_TOKEN = re.compile(r"[(),]|[^\s(),]+")


def timestamptz_micros(value: Any) -> int:
    """A Timestamptz as UTC microseconds: the number itself, or ISO 8601 text with an offset
    (``Z`` or ``+hh:mm``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise UnsupportedValueError(f"a timestamptz as {type(value).__name__}")
    moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise UnsupportedValueError(f"a timestamptz without an offset: {value!r}")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def canonical_wkt(value: Any) -> str:
    """WKT with single spaces and every number as the shortest text of its double."""
    if not isinstance(value, str):
        raise UnsupportedValueError(f"a geometry as {type(value).__name__}")
    out: list[str] = []
    for part in _WKT_TOKEN.findall(value):
        if part in "(),":
            out.append(part)
            continue
        try:
            out.append(repr(float(part)))
        except ValueError:
            out.append(part.upper())
    return " ".join(out)


def encode_value(kind: str, value: Any) -> tuple[bytes, bytes]:
    """(type tag, value bytes) of one field."""
    if value is None:
        return b"n", b""
    if kind == "BOOL":
        return b"b", b"\x01" if value else b"\x00"
    if kind in INT_KINDS:
        return b"i", _I64.pack(int(value))
    if kind in FLOAT_KINDS:
        return b"d", _F64.pack(float(value))
    if kind in TEXT_KINDS:
        if not isinstance(value, str):
            raise UnsupportedValueError(f"a varchar as {type(value).__name__}")
        return b"s", value.encode()
    if kind == "FLOAT_VECTOR":
        return b"v", np.asarray(value, dtype="<f4").tobytes()
    if kind in BYTE_VECTOR_KINDS:
        return b"x", _vector_bytes(value)
    if kind == "SPARSE_FLOAT_VECTOR":
        return b"p", _sparse_bytes(value)
    if kind == "TIMESTAMPTZ":
        return b"t", _I64.pack(timestamptz_micros(value))
    if kind == "GEOMETRY":
        return b"g", canonical_wkt(value).encode()
    return b"j", _json(value)  # JSON, ARRAY, dynamic fields and kinds not listed


def encode_row(row: Mapping[str, Any], kinds: FieldKinds) -> bytes:
    """The canonical encoding of a row (see the module docstring)."""
    parts = []
    for name in sorted(row):
        tag, data = encode_value(kinds.get(name, "JSON"), row[name])
        encoded_name = name.encode()
        parts += [LENGTH.pack(len(encoded_name)), encoded_name, tag, LENGTH.pack(len(data)), data]
    return b"".join(parts)


def row_hash(row: Mapping[str, Any], kinds: FieldKinds) -> int:
    """A 128-bit hash of a row's canonical encoding."""
    digest = hashlib.blake2b(encode_row(row, kinds), digest_size=HASH_BYTES).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Digest:
    """The digest of a set of rows: count and sum of row hashes mod 2**128."""

    count: int = 0
    total: int = 0

    def add(self, row_hash_value: int) -> Digest:
        return Digest(self.count + 1, (self.total + row_hash_value) % MOD)

    def __add__(self, other: Digest) -> Digest:
        return Digest(self.count + other.count, (self.total + other.total) % MOD)

    def hex(self) -> str:
        return f"{self.count}:{self.total:032x}"


def digest_hashes(hashes: Iterable[int]) -> Digest:
    count = total = 0
    for value in hashes:
        count += 1
        total += value
    return Digest(count, total % MOD)


def digest_rows(rows: Iterable[Mapping[str, Any]], kinds: FieldKinds) -> Digest:
    """The digest of ``rows`` in any order."""
    return digest_hashes(row_hash(row, kinds) for row in rows)
