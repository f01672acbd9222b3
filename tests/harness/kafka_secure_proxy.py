"""A Kafka broker behind TLS and SASL, for tests: librdkafka's mock cluster behind a proxy of ours.

No Apache Kafka can run here, and librdkafka's mock cluster (tests/harness/kafka_mock.py) speaks
neither TLS nor SASL. So a child process (this file, run as a script) creates the mock through
ctypes on the librdkafka bundled with confluent_kafka, makes its broker advertise the port of a
proxy, and runs that proxy (asyncio): it ends TLS (with ``ssl``'s server context; mutual TLS when
a client CA is given), and, when users are given, does the broker's side of SASL itself before
passing bytes through:

- it answers ApiVersions with the mock's list plus SaslHandshake (17, v0-1) and
  SaslAuthenticate (36, v0-1);
- SaslHandshake names the mechanisms it serves (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512);
- SaslAuthenticate checks PLAIN, or runs SCRAM (RFC 5802, RFC 7677) against its user table;
  wrong credentials are error 58 SASL_AUTHENTICATION_FAILED with ``AUTH_FAILED_MESSAGE``, as
  Kafka does. Any other request before authentication closes the connection, and so does a
  request longer than Kafka's ``socket.request.max.bytes`` (a TLS client at a plaintext
  listener sends one).
- SIGUSR1 revokes every user (logins refused, open connections cut: credentials taken away
  from a running client), SIGUSR2 gives them back.

The client side is librdkafka's real code; the broker side of TLS is Python's ``ssl``, the broker
side of SASL is this file. Run as a script it imports only the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import glob
import hashlib
import hmac
import importlib.util
import json
import os
import secrets
import signal
import socket
import ssl
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ADDRESS_FILE = "kafka-secure.address"
AUTH_FAILED_MESSAGE = "Authentication failed: Invalid username or password"
SCRAM_ITERATIONS = 4096
_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
_SASL_AUTHENTICATION_FAILED, _UNSUPPORTED_SASL_MECHANISM, _ILLEGAL_SASL_STATE = 58, 33, 34
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = ("PLAIN", *_HASHES)


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """What the proxy asks of its clients."""

    cert_file: str = ""  # TLS when given: the broker's certificate and key
    key_file: str = ""
    client_ca_file: str = ""  # mutual TLS: client certificates must chain to this CA
    users: dict[str, str] = field(default_factory=dict)  # SASL when given: user -> password


@dataclass(frozen=True, kw_only=True)
class SecureKafka:
    bootstrap: str  # the proxy: what clients dial
    pid: int
    log_path: Path


# --------------------------------------------------------------------------------------------
# The Kafka protocol, the little of it the proxy reads


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _read_string(data: bytes, at: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">h", data, at)
    return data[at + 2 : at + 2 + size].decode(), at + 2 + max(size, 0)


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _put_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _with_sasl_apis(response: bytes, version: int) -> bytes:
    """An ApiVersions response body (after the correlation id) with SASL's two APIs added."""
    (error,) = struct.unpack_from(">h", response, 0)
    if error:
        return response
    added = [(_SASL_HANDSHAKE, 0, 1), (_SASL_AUTHENTICATE, 0, 1)]
    if version >= 3:  # flexible: compact array, a tag buffer after each entry
        count, at = _uvarint(response, 2)
        end = at + (count - 1) * 7
        entries = b"".join(struct.pack(">hhh", *api) + b"\x00" for api in added)
        return (
            response[:2]
            + _put_uvarint(count + len(added))
            + response[at:end]
            + entries
            + (response[end:])
        )
    (count,) = struct.unpack_from(">i", response, 2)
    end = 6 + count * 6
    entries = b"".join(struct.pack(">hhh", *api) for api in added)
    return (
        response[:2]
        + struct.pack(">i", count + len(added))
        + response[6:end]
        + entries
        + (response[end:])
    )


# a broker's socket.request.max.bytes (Kafka's default): a longer request closes the connection,
# as Kafka does; a TLS ClientHello sent to a plaintext listener reads as one (0x16030100...)
_MAX_REQUEST = 104857600


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 <= size <= _MAX_REQUEST:
        raise ValueError(f"invalid request size {size}")
    return await reader.readexactly(size)


def _frame(correlation: int, body: bytes) -> bytes:
    return struct.pack(">ii", len(body) + 4, correlation) + body


# --------------------------------------------------------------------------------------------
# SASL, the broker's side


class _Scram:
    """One SCRAM exchange (RFC 5802): client-first, then client-final."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self._hash = _HASHES[mechanism]
        self._users = users
        self._first_bare = self._server_first = self._password = ""
        self._salt = secrets.token_bytes(16)

    def first(self, message: str) -> str:
        self._first_bare = message.split(",", 2)[2]
        fields = dict(part.split("=", 1) for part in self._first_bare.split(","))
        self._password = self._users.get(fields["n"], "")
        nonce = fields["r"] + base64.b64encode(secrets.token_bytes(18)).decode()
        salt = base64.b64encode(self._salt).decode()
        self._server_first = f"r={nonce},s={salt},i={SCRAM_ITERATIONS}"
        return self._server_first

    def final(self, message: str) -> str | None:
        """The server-final message, or None when the proof is wrong."""
        without_proof, _, proof = message.rpartition(",p=")
        salted = hashlib.pbkdf2_hmac(
            self._hash, self._password.encode(), self._salt, SCRAM_ITERATIONS
        )
        auth = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self._hash)
        stored = hashlib.new(self._hash, client_key).digest()
        signature = hmac.digest(stored, auth, self._hash)
        expected = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if not self._password or not hmac.compare_digest(expected, base64.b64decode(proof)):
            return None
        server_key = hmac.digest(salted, b"Server Key", self._hash)
        return "v=" + base64.b64encode(hmac.digest(server_key, auth, self._hash)).decode()


def _auth_answer(version: int, error: int, message: str | None, token: bytes) -> bytes:
    body = struct.pack(">h", error) + _string(message) + struct.pack(">i", len(token)) + token
    return body + (struct.pack(">q", 0) if version >= 1 else b"")


async def _authenticate(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    mock: tuple[str, int],
    users: dict[str, str],
) -> bool:
    """Run the connection's requests up to a successful SaslAuthenticate; False: close it."""
    mechanism = ""
    scram: _Scram | None = None
    while True:
        request = await _read_frame(client_r)
        key, version, correlation = struct.unpack_from(">hhi", request, 0)
        _client_id, at = _read_string(request, 8)
        if key == _API_VERSIONS:
            mock_r, mock_w = await asyncio.open_connection(*mock)
            mock_w.write(struct.pack(">i", len(request)) + request)
            await mock_w.drain()
            response = await _read_frame(mock_r)
            mock_w.close()
            body = _with_sasl_apis(response[4:], version)
            client_w.write(_frame(correlation, body))
        elif key == _SASL_HANDSHAKE:
            mechanism, _ = _read_string(request, at)
            error = 0 if mechanism in MECHANISMS else _UNSUPPORTED_SASL_MECHANISM
            listed = b"".join(_string(m) for m in MECHANISMS)
            body = struct.pack(">hi", error, len(MECHANISMS)) + listed
            client_w.write(_frame(correlation, body))
            if error:
                return False
            scram = _Scram(mechanism, users) if mechanism in _HASHES else None
        elif key == _SASL_AUTHENTICATE and mechanism:
            (size,) = struct.unpack_from(">i", request, at)
            token = request[at + 4 : at + 4 + size]
            if scram is None:  # PLAIN: authzid NUL user NUL password
                _authzid, user, password = token.decode().split("\0")
                good = users.get(user) is not None and hmac.compare_digest(
                    users[user].encode(), password.encode()
                )
                answer, done = b"", True
            elif not scram._first_bare:
                answer, good, done = scram.first(token.decode()).encode(), True, False
            else:
                final = scram.final(token.decode())
                answer, good, done = (final or "").encode(), final is not None, True
            if not good:
                error, message = _SASL_AUTHENTICATION_FAILED, AUTH_FAILED_MESSAGE
                client_w.write(_frame(correlation, _auth_answer(version, error, message, b"")))
                await client_w.drain()
                return False
            client_w.write(_frame(correlation, _auth_answer(version, 0, None, answer)))
            if done:
                await client_w.drain()
                return True
        else:
            return False
        await client_w.drain()


# --------------------------------------------------------------------------------------------
# The child process: the mock, and the proxy in front of it


def _librdkafka() -> ctypes.CDLL:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    lib = ctypes.CDLL(sorted(glob.glob(str(libs / "librdkafka*.so*")))[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.rd_kafka_conf_set.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
    lib.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_broker_set_host_port.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_host_port.argtypes += [ctypes.c_char_p, ctypes.c_int]
    return lib


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_context(config: ProxyConfig) -> ssl.SSLContext | None:
    if not config.cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.cert_file, config.key_file)
    if config.client_ca_file:
        context.load_verify_locations(config.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _proxy(config: ProxyConfig, port: int, mock: tuple[str, int], ready: Path) -> None:
    revoked = False  # SIGUSR1: every login refused, every connection cut; SIGUSR2: undone
    clients: set[asyncio.StreamWriter] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        users = {} if revoked else config.users
        try:
            if config.users and not await _authenticate(client_r, client_w, mock, users):
                client_w.close()
                return
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, struct.error):
            client_w.close()
            return
        clients.add(client_w)
        mock_r, mock_w = await asyncio.open_connection(*mock)
        try:
            await asyncio.gather(_pipe(client_r, mock_w), _pipe(mock_r, client_w))
        finally:
            clients.discard(client_w)

    def revoke(now: bool) -> None:
        nonlocal revoked
        revoked = now
        for client in list(clients) if now else []:
            client.close()
        print(f"secure proxy: logins {'refused' if now else 'accepted'}", file=sys.stderr)

    context = _server_context(config)
    timeout = {"ssl_handshake_timeout": 5.0} if context is not None else {}
    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=context, **timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, revoke, True)
    loop.add_signal_handler(signal.SIGUSR2, revoke, False)
    tmp = ready.with_name(ready.name + ".tmp")
    tmp.write_text(f"127.0.0.1:{port}\n", encoding="utf-8")
    os.replace(tmp, ready)
    print(f"secure proxy on 127.0.0.1:{port} -> mock {mock}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()


def _serve(config: ProxyConfig, address_file: Path) -> None:
    lib = _librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"test.mock.num.brokers", b"1", error, 512)
    handle = lib.rd_kafka_new(0, conf, error, 512)  # a producer: its mock lives as long as it
    if not handle:
        raise SystemExit(f"librdkafka: {error.value.decode()}")
    cluster = lib.rd_kafka_handle_mock_cluster(handle)
    host, _, port = lib.rd_kafka_mock_cluster_bootstraps(cluster).decode().rpartition(":")
    proxy_port = _free_port()
    lib.rd_kafka_mock_broker_set_host_port(cluster, 1, b"127.0.0.1", proxy_port)
    asyncio.run(_proxy(config, proxy_port, (host, int(port)), address_file))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="a ProxyConfig as JSON")
    parser.add_argument("--address-file", type=Path, required=True)
    args = parser.parse_args(argv)
    config = ProxyConfig(**json.loads(args.config.read_text(encoding="utf-8")))
    _serve(config, args.address_file)


# --------------------------------------------------------------------------------------------
# The test-side context manager


@contextlib.contextmanager
def kafka_secure_cluster(
    workdir: Path, config: ProxyConfig, *, startup_timeout: float = 30.0
) -> Iterator[SecureKafka]:
    """A one-broker Kafka mock reached only through the proxy, in a child process of its own."""
    from harness.kafka_mock import read_address_file
    from harness.services import MissingBinaryError, _running, wait_until

    if importlib.util.find_spec("confluent_kafka") is None:
        raise MissingBinaryError("the PyPI package confluent-kafka is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    address_file = workdir / ADDRESS_FILE
    address_file.unlink(missing_ok=True)
    config_file = workdir / "kafka-secure.json"
    config_file.write_text(json.dumps(config.__dict__), encoding="utf-8")
    log_path = workdir / "kafka-secure.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "--config", str(config_file)]
    argv += ["--address-file", str(address_file)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with _running(argv, log_path=log_path, env=env, cwd=workdir, grace=5.0) as process:
        bootstrap = wait_until(
            lambda: read_address_file(address_file),
            startup_timeout,
            f"kafka secure proxy (address file {address_file})",
            process=process,
            log_paths=[log_path],
        )
        yield SecureKafka(bootstrap=bootstrap, pid=process.pid, log_path=log_path)


if __name__ == "__main__":
    main()
