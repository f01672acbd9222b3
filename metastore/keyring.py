"""The keys that encrypt secrets at rest, and the envelope a sealed secret is stored in.

A key ring is a list of 256-bit keys, each with an id; the first one encrypts, every one
decrypts, so a ring in the middle of a rotation reads both generations. Its text form (the key
file, or ``CDC_SECRETS__KEY``) is one ``<id>:<base64 key>`` per line (or separated by commas);
blank lines and ``#`` comments are ignored.

A sealed value is AES-256-GCM (an AEAD from ``cryptography``) of the UTF-8 text, with a random
96-bit nonce, authenticated together with where it is stored (task id and field: a value copied
to another task or field does not open)::

    {"$sealed": "aes-256-gcm", "kid": "<key id>", "data": "<base64 of nonce + ciphertext>"}

A JSON object never stands where a clear secret (a string) stood, so the marker cannot be
mistaken for a password that happens to look like one.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from metastore.errors import MetaStoreError

MARKER = "$sealed"
ALGORITHM = "aes-256-gcm"
KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class KeyRingError(ValueError):
    """A key ring's text cannot be used; the message names the line, never a key."""


class SecretUnreadableError(MetaStoreError):
    """A stored secret does not open with this daemon's keys (not retriable: the same keys
    will not open it on a second try)."""


def is_sealed(value: Any) -> bool:
    return isinstance(value, Mapping) and MARKER in value


@dataclass(frozen=True)
class KeyRing:
    keys: tuple[tuple[str, bytes], ...]  # (id, key); the first encrypts

    @classmethod
    def parse(cls, text: str, where: str) -> KeyRing:
        keys: list[tuple[str, bytes]] = []
        entries = [
            entry.strip()
            for line in text.splitlines()
            if not line.strip().startswith("#")
            for entry in line.split(",")
        ]
        for number, entry in enumerate(entries, start=1):
            if not entry:
                continue
            key_id, sep, encoded = entry.partition(":")
            if not sep or not _KEY_ID.fullmatch(key_id):
                raise KeyRingError(f"{where}: entry {number} is not <id>:<base64 key>")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise KeyRingError(f"{where}: key {key_id!r} is not base64") from None
            if len(key) != KEY_BYTES:
                raise KeyRingError(f"{where}: key {key_id!r} is not {KEY_BYTES} bytes")
            if any(known == key_id for known, _ in keys):
                raise KeyRingError(f"{where}: key id {key_id!r} appears twice")
            keys.append((key_id, key))
        return cls(tuple(keys))

    @staticmethod
    def new_key() -> tuple[str, bytes]:
        key_id = time.strftime("k%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()
        return key_id, AESGCM.generate_key(bit_length=KEY_BYTES * 8)

    def text(self) -> str:
        lines = [
            "# milvus-cdc secret keys: the first encrypts, every one decrypts. Keep this file "
            "secret; without it the secrets stored in the metastore cannot be read."
        ]
        lines += [f"{key_id}:{base64.b64encode(key).decode()}" for key_id, key in self.keys]
        return "\n".join(lines) + "\n"

    @property
    def primary(self) -> str | None:
        return self.keys[0][0] if self.keys else None

    @property
    def ids(self) -> list[str]:
        return [key_id for key_id, _ in self.keys]

    def encoded_keys(self) -> list[str]:
        """The keys as their text spells them, for the log redactor."""
        return [base64.b64encode(key).decode() for _, key in self.keys]

    def seal(self, plain: str, context: str) -> dict[str, str]:
        if not self.keys:
            raise SecretUnreadableError("no secret key is configured (secrets.keyFile)")
        key_id, key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(key).encrypt(nonce, plain.encode("utf-8"), context.encode("utf-8"))
        data = base64.b64encode(nonce + sealed).decode("ascii")
        return {MARKER: ALGORITHM, "kid": key_id, "data": data}

    def open(self, envelope: Mapping[str, Any], context: str) -> str:
        """The clear text; ``SecretUnreadableError`` saying why when it does not open."""
        key_id = str(envelope.get("kid", ""))
        if envelope.get(MARKER) != ALGORITHM:
            raise SecretUnreadableError(
                f"{context}: sealed with {envelope.get(MARKER)!r}, which this daemon cannot open"
            )
        key = dict(self.keys).get(key_id)
        if key is None:
            raise SecretUnreadableError(
                f"{context} is encrypted with key {key_id!r}, which is not in this daemon's "
                f"key ring (it holds {', '.join(self.ids) or 'no key'}); give the daemon that "
                "key (secrets.keyFile or CDC_SECRETS__KEY)"
            )
        try:
            raw = base64.b64decode(str(envelope.get("data", "")), validate=True)
            plain = AESGCM(key).decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], context.encode("utf-8")
            )
        except (binascii.Error, ValueError, InvalidTag):
            raise SecretUnreadableError(
                f"{context} does not decrypt with key {key_id!r}: the stored value was altered "
                "or belongs elsewhere"
            ) from None
        return plain.decode("utf-8")
