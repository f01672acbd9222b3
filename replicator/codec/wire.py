"""Reading single fields of a protobuf message without parsing the whole message.

Used to route on a record's collection before deciding whether to decode its body: an Insert's
collectionID (field 7) sits before its column data, so the scan stops after a few bytes.
"""

from __future__ import annotations

from collections.abc import Iterator


class WireError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _walk(buf: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Every field as (number, wire type, value, start): varints and fixed-width fields carry
    their value; length-delimited ones their length and where their bytes start (not sliced,
    so skipping a large column costs nothing)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos)
            yield number, wire_type, value, pos
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            if pos + width > len(buf):
                raise WireError("truncated field")
            yield number, wire_type, int.from_bytes(buf[pos : pos + width], "little"), pos
            pos += width
        elif wire_type == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise WireError("truncated field")
            yield number, wire_type, length, pos
            pos += length
        else:
            raise WireError(f"unsupported wire type {wire_type}")


def find_varint_field(buf: bytes, field_number: int) -> int | None:
    """The first value of varint field ``field_number``, or None if absent."""
    found = _find(buf, field_number, 0)
    return None if found is None else found[0]


def find_bytes_field(buf: bytes, field_number: int) -> bytes | None:
    """The first value of length-delimited field ``field_number``, or None if absent."""
    found = _find(buf, field_number, 2)
    return None if found is None else buf[found[1] : found[1] + found[0]]


def _find(buf: bytes, field_number: int, wanted_type: int) -> tuple[int, int] | None:
    """(value, end) of the first varint ``field_number`` (``wanted_type`` 0), or (length,
    start) of the first length-delimited one (2). :func:`_walk` in one loop, with the one-byte
    varints (keys, lengths, small values) read in place: every record of every task is routed
    through here."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        wire_type = key & 7
        if wire_type == 0 or wire_type == 2:
            if pos >= end:
                raise WireError("truncated varint")
            value = buf[pos]
            if value < 0x80:
                pos += 1
            else:
                value, pos = _varint(buf, pos)
            if wire_type == 2 and pos + value > end:
                raise WireError("truncated field")
            if key >> 3 == field_number and wire_type == wanted_type:
                return value, pos
            if wire_type == 2:
                pos += value
        elif wire_type == 1 or wire_type == 5:
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise WireError("truncated field")
        else:
            raise WireError(f"unsupported wire type {wire_type}")
    return None


def to_signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Every (field number, wire type, value) of a message: ints for varints and fixed-width
    fields, bytes for length-delimited ones (strings, bytes, sub-messages, packed repeats)."""
    for number, wire_type, value, start in _walk(buf):
        if wire_type == 2:
            yield number, wire_type, buf[start : start + value]
        else:
            yield number, wire_type, value


def packed_varints(buf: bytes) -> list[int]:
    values = []
    pos = 0
    while pos < len(buf):
        value, pos = _varint(buf, pos)
        values.append(value)
    return values


def int64s(value: int | bytes) -> list[int]:
    """One occurrence of a repeated int64 field, as ``iter_fields`` gives it: packed (bytes)
    or a single varint; signed."""
    raw = packed_varints(value) if isinstance(value, bytes) else [value]
    return [to_signed64(v) for v in raw]


def encode_varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint (callers mask negative values to 64 bits)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
