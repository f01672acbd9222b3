"""A RocksMQ store written the way a Milvus 2.6 standalone writes its WAL, for tests that need
a RocksMQ source without a 2.6 server (the reader is replicator/sources/rocksmq.py).

Layout (MILVUS-WIRE.md, "RocksMQ"): a RocksDB whose ``default`` column family has one key per
message, ``<topic>/<id>`` with the id in decimal, fixed width; the value is the 10 bytes
``FF FE FD FC "STREAM"`` followed by ``RMQMessageLayout{payload = 1, properties = 2 (map)}``.
Ids here are 18-digit numbers counting up from a hybrid-TSO-like base, as Milvus's are.
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict

from replicator.codec.wire import encode_varint
from replicator.sources.rocksmq import STREAMING_MAGIC

ID_BASE = 450_000_000_000_000_000  # 18 digits, like Milvus's TSO-based ids


def _field(number: int, data: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(data)) + data


def stream_value(payload: bytes, properties: dict[str, str]) -> bytes:
    """A 2.6 RocksMQ value: the magic prefix and the layout message."""
    body = _field(1, payload)
    for key, value in properties.items():
        body += _field(2, _field(1, key.encode()) + _field(2, value.encode()))
    return STREAMING_MAGIC + body


class RocksmqWriter:
    """The primary (writing) instance of a RocksMQ store; ``produce`` returns the message id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db: Rdict | None = Rdict(str(path), options)
        self._next = ID_BASE

    def produce(self, topic: str, payload: bytes, properties: dict[str, str]) -> int:
        if self._db is None:
            raise RuntimeError(f"the RocksMQ writer of {self.path} is closed")
        msg_id = self._next
        self._next += 1
        self._db[f"{topic}/{msg_id}".encode()] = stream_value(payload, properties)
        return msg_id

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
