"""Pulsar positions without a broker: message id bytes, the offset encoding, "strictly after"
resume semantics, topic names, authentication settings, and the reader over a fake client."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metastore import Position
from replicator.sources import pulsar as ps
from replicator.sources import pulsar_auth
from replicator.sources.base import SourceUnavailableError
from replicator.sources.pulsar import (
    PulsarConfigError,
    PulsarSource,
    receiver_queue_size,
    service_url,
    topic_name,
)
from replicator.sources.pulsar_auth import (
    AuthConfig,
    auth_config,
    build_authentication,
    parse_auth_params,
)
from replicator.sources.pulsar_ids import (
    EARLIEST,
    LATEST,
    MessageIdParts,
    is_after,
    msg_id_before,
    offset_of_msg_id,
)

INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
PCHANNEL = "by-dev-rootcoord-dml_3"
SECRET = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.sig"  # not a real token


def cpp_id(parts: MessageIdParts) -> Any:
    """The pulsar-client (C++) MessageId with the same fields."""
    return pulsar.MessageId(parts.partition, parts.ledger_id, parts.entry_id, parts.batch_index)


ledgers = st.integers(min_value=-1, max_value=INT64_MAX)
entries = st.integers(min_value=-1, max_value=INT64_MAX)
batches = st.integers(min_value=-1, max_value=INT32_MAX)
ids = st.builds(MessageIdParts, ledgers, entries, batches)


# --- message id bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "parts",
    [
        MessageIdParts(12, 34),
        MessageIdParts(12, 34, 5),
        MessageIdParts(0, 0, 0),
        MessageIdParts(7, 0, -1, partition=3),
        MessageIdParts(INT64_MAX, INT64_MAX, INT32_MAX),
        EARLIEST,
        LATEST,
    ],
)
def test_serialize_is_byte_for_byte_the_cpp_client(parts: MessageIdParts) -> None:
    expected = cpp_id(parts).serialize()
    assert parts.serialize() == expected
    assert MessageIdParts.deserialize(expected) == parts
    back = pulsar.MessageId.deserialize(parts.serialize())
    assert MessageIdParts.of(back) == parts
    assert MessageIdParts.of(back).partition == parts.partition


def test_earliest_and_latest_are_the_clients() -> None:
    assert MessageIdParts.of(pulsar.MessageId.earliest) == EARLIEST
    assert MessageIdParts.of(pulsar.MessageId.latest) == LATEST
    assert EARLIEST.offset == 0


def test_go_client_ids_as_milvus_stores_them() -> None:
    # Milvus (Go client) writes partition, batch index and batch size explicitly:
    # ledgerId=12 entryId=34 partition=-1 batch_index=0 batch_size=1
    go_bytes = bytes.fromhex("080c1022" + "18ffffffffffffffffff01" + "2000" + "3001")
    parts = MessageIdParts.deserialize(go_bytes)
    assert (parts.ledger_id, parts.entry_id, parts.batch_index) == (12, 34, 0)
    assert (parts.partition, parts.batch_size) == (-1, 1)
    assert MessageIdParts.of(pulsar.MessageId.deserialize(go_bytes)) == parts
    # unknown / repeated fields (ack_set, first_chunk_message_id) are skipped
    with_extras = go_bytes + bytes.fromhex("2801") + bytes.fromhex("3a04080b1021")
    assert MessageIdParts.deserialize(with_extras) == parts


@pytest.mark.parametrize(
    "data",
    [
        b"",
        (41).to_bytes(8, "little"),  # a Kafka position
        b"\x08\x01",  # entryId missing
        b"\x08",  # truncated
        b"\x0a\x01\x02\x10\x01",  # ledgerId with the wrong wire type
        b"garbage",
    ],
)
def test_what_is_not_a_message_id_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="Pulsar message id"):
        MessageIdParts.deserialize(data)


def test_out_of_range_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="ledger_id -2 out of range"):
        MessageIdParts(-2, 0)
    with pytest.raises(ValueError, match="batch_index"):
        MessageIdParts(0, 0, INT32_MAX + 1)
    with pytest.raises(ValueError, match="not a Pulsar offset"):
        MessageIdParts.from_offset(-1)
    with pytest.raises(ValueError, match="not a Pulsar offset"):
        MessageIdParts.from_offset(1 << 200)
    with pytest.raises(ValueError, match="entry_id"):
        MessageIdParts.from_offset((1 << 96) - 1)


def test_position_round_trip_keeps_the_serialized_id() -> None:
    message_id = pulsar.MessageId(-1, 1234567, 89, 4)._msg_id
    position = Position(ps.BACKEND, PCHANNEL, message_id.serialize(), ts=(1 << 40))
    stored = Position.from_json(position.to_json())
    assert stored == position
    restored = pulsar.MessageId.deserialize(stored.msg_id)
    assert restored == message_id
    assert offset_of_msg_id(stored.msg_id) == MessageIdParts.of(message_id).offset


# --- offsets ------------------------------------------------------------------------------------
def test_offsets_increase_over_ledger_entry_and_batch() -> None:
    topic = [
        EARLIEST,
        MessageIdParts(5, -1),  # before the first entry of ledger 5
        MessageIdParts(5, 0),  # non-batched
        MessageIdParts(5, 1, 0),  # a batch
        MessageIdParts(5, 1, 1),
        MessageIdParts(5, 1, 999),
        MessageIdParts(5, 2),
        MessageIdParts(5, (1 << 32) + 7),  # entry ids beyond 32 bits stay ordered
        MessageIdParts(6, 0, 0),
        MessageIdParts(1 << 40, 0),
        MessageIdParts(INT64_MAX, INT64_MAX - 1, INT32_MAX),
        LATEST,
    ]
    offsets = [parts.offset for parts in topic]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(offsets)
    assert sorted(topic) == topic
    for earlier, later in itertools.pairwise(topic):
        assert cpp_id(earlier) < cpp_id(later)  # the C++ client agrees


@given(ids, ids)
def test_offset_order_is_the_message_id_order(a: MessageIdParts, b: MessageIdParts) -> None:
    assert (a.offset < b.offset) == (a < b) == (cpp_id(a) < cpp_id(b))
    assert (a.offset == b.offset) == (a == b)


@given(ids)
def test_offset_is_invertible(parts: MessageIdParts) -> None:
    assert MessageIdParts.from_offset(parts.offset) == parts
    assert parts.offset >= 0
    assert offset_of_msg_id(parts.serialize()) == parts.offset


def test_offset_ignores_partition_and_batch_size() -> None:
    plain = MessageIdParts(3, 4, 5)
    assert MessageIdParts(3, 4, 5, partition=-1, batch_size=10).offset == plain.offset
    assert MessageIdParts(3, 4, 5, batch_size=10) == plain


# --- resume semantics ---------------------------------------------------------------------------
# A model of what a reader created at `start` (exclusive) receives, from the code of the broker
# (PersistentTopic.getNonDurableSubscription) and of the C++ client (ConsumerImpl):
#   * the broker sees every client start id as a batch message id and, when ledger and entry are
#     >= 0, places the cursor one entry back: entry E of the start is sent again;
#   * the client drops, in entry E, the non-batched message (entry <= E in that ledger) or the
#     batched messages with batch index <= the start's batch index.
def model_reader(topic: list[MessageIdParts], start: MessageIdParts) -> list[MessageIdParts]:
    ledger, entry = start.ledger_id, start.entry_id
    if ledger >= 0 and entry >= 0:
        entry -= 1
    sent = [m for m in topic if (m.ledger_id, m.entry_id) > (ledger, entry)]
    kept = []
    for m in sent:
        same_entry = (m.ledger_id, m.entry_id) == (start.ledger_id, start.entry_id)
        if m.batch_index >= 0:
            if same_entry and m.batch_index <= start.batch_index:
                continue
        elif m.ledger_id == start.ledger_id and m.entry_id <= start.entry_id:
            continue
        kept.append(m)
    return kept


# ledger 7: entry 0 plain, entry 1 a batch of 3, entry 2 plain, entry 3 a batch of 2;
# ledger 9: entry 0 a batch of 2, entry 1 plain
TOPIC = [
    MessageIdParts(7, 0),
    MessageIdParts(7, 1, 0),
    MessageIdParts(7, 1, 1),
    MessageIdParts(7, 1, 2),
    MessageIdParts(7, 2),
    MessageIdParts(7, 3, 0),
    MessageIdParts(7, 3, 1),
    MessageIdParts(9, 0, 0),
    MessageIdParts(9, 0, 1),
    MessageIdParts(9, 1),
]


def reader_filter(topic: list[MessageIdParts], start: MessageIdParts) -> list[MessageIdParts]:
    return [m for m in topic if is_after(m, start)]


@pytest.mark.parametrize("start", TOPIC, ids=str)
def test_resume_after_a_record_returns_what_follows_it(start: MessageIdParts) -> None:
    after = [m for m in TOPIC if m > start]
    assert model_reader(TOPIC, start) == after
    assert reader_filter(TOPIC, start) == after


@pytest.mark.parametrize("target", TOPIC, ids=str)
def test_msg_id_before_makes_the_reader_start_at_the_message(target: MessageIdParts) -> None:
    before = MessageIdParts.deserialize(msg_id_before(target.serialize()))
    expected = [m for m in TOPIC if m >= target]
    assert model_reader(TOPIC, before) == expected
    assert reader_filter(TOPIC, before) == expected


def test_milvus_go_id_of_a_plain_message_resumes_after_it() -> None:
    # the Go client gives batch index 0 to a non-batched message; C++ records have -1
    go_start = MessageIdParts(7, 2, 0, batch_size=1)
    expected = [m for m in TOPIC if (m.ledger_id, m.entry_id) > (7, 2)]
    assert model_reader(TOPIC, go_start) == expected
    assert reader_filter(TOPIC, go_start) == expected
    before = MessageIdParts.deserialize(msg_id_before(go_start.serialize()))
    assert reader_filter(TOPIC, before)[0] == MessageIdParts(7, 2)
    assert model_reader(TOPIC, before)[0] == MessageIdParts(7, 2)


def test_start_bounds() -> None:
    assert reader_filter(TOPIC, EARLIEST) == TOPIC
    assert model_reader(TOPIC, EARLIEST) == TOPIC
    assert is_after(TOPIC[0], None)
    assert is_after(TOPIC[0], LATEST)  # a read from "latest" keeps what arrives
    with pytest.raises(ValueError, match="no message precedes"):
        msg_id_before(EARLIEST.serialize())
    with pytest.raises(ValueError, match="no message precedes"):
        msg_id_before(LATEST.serialize())
    first_of_ledger = MessageIdParts.deserialize(msg_id_before(MessageIdParts(9, 0, 0).serialize()))
    assert first_of_ledger == MessageIdParts(9, -1, INT32_MAX)


# --- names and settings ------------------------------------------------------------------------
def test_topic_name() -> None:
    assert topic_name("public", "default", PCHANNEL) == f"persistent://public/default/{PCHANNEL}"
    assert PulsarSource("pulsar://b:6650", "t1", "ns").topic("c_0") == "persistent://t1/ns/c_0"
    for bad in [("", "default", "c"), ("a/b", "default", "c"), ("public", "default", "")]:
        with pytest.raises(ValueError, match="is not a single non-empty name"):
            topic_name(*bad)


def test_service_url() -> None:
    assert service_url("pulsar://h:6650") == "pulsar://h:6650"
    assert service_url("pulsar+ssl://h:6651") == "pulsar+ssl://h:6651"
    assert service_url(" h:6650 ") == "pulsar://h:6650"
    with pytest.raises(ValueError, match="empty"):
        service_url("")


def test_receiver_queue_follows_max_message_size() -> None:
    assert receiver_queue_size(5242880) == 16
    assert receiver_queue_size(1024) == 1000
    assert receiver_queue_size(1 << 20) == 64
    with pytest.raises(ValueError, match="positive"):
        receiver_queue_size(0)


# --- authentication ------------------------------------------------------------------------------
def test_auth_params_formats() -> None:
    assert parse_auth_params("") == {}
    assert parse_auth_params(f"token:{SECRET}") == {"token": SECRET}
    assert parse_auth_params('{"token": "x", "n": 1}') == {"token": "x", "n": "1"}
    assert parse_auth_params("tlsCertFile:/c.pem,tlsKeyFile:/k.pem") == {
        "tlsCertFile": "/c.pem",
        "tlsKeyFile": "/k.pem",
    }
    with pytest.raises(ValueError, match="JSON"):
        parse_auth_params("{not json")


@pytest.mark.parametrize(
    ("plugin", "params", "method", "expected"),
    [
        ("token", f"token:{SECRET}", "token", {"token": SECRET}),
        ("token", SECRET, "token", {"token": SECRET}),
        (
            "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            f'{{"token":"{SECRET}"}}',
            "token",
            {"token": SECRET},
        ),
        ("token", "file:///run/secrets/pulsar", "token-file", {"file": "/run/secrets/pulsar"}),
        (
            "tls",
            "tlsCertFile:/c.pem,tlsKeyFile:/k.pem",
            "tls",
            {"tlsCertFile": "/c.pem", "tlsKeyFile": "/k.pem"},
        ),
        (
            "basic",
            f"userId:milvus,password:{SECRET}",
            "basic",
            {"username": "milvus", "password": SECRET},
        ),
        (
            "oauth2",
            '{"type":"client_credentials","issuerUrl":"https://i","privateKey":"/k.json",'
            '"audience":"a"}',
            "oauth2",
            {"issuer_url": "https://i", "private_key": "/k.json", "audience": "a"},
        ),
    ],
)
def test_auth_plugins(plugin: str, params: str, method: str, expected: dict[str, str]) -> None:
    config = auth_config(plugin, params)
    assert config is not None
    assert config.method == method
    assert dict(config.params) == expected
    assert build_authentication(config) is not None  # pulsar-client accepts it (no connection)


def test_no_auth_and_refused_auth() -> None:
    assert auth_config("", "") is None
    assert auth_config("", f"token:{SECRET}") is None  # like Milvus: no plugin, no auth
    assert build_authentication(None) is None
    with pytest.raises(ValueError, match="not supported") as unknown:
        auth_config("kerberos", f"token:{SECRET}")
    with pytest.raises(ValueError, match="'token' or 'file'") as missing:
        auth_config("token", f"jwt:{SECRET}")
    with pytest.raises(ValueError, match="tlsCertFile") as tls:
        auth_config("tls", f"tlsCertFile:{SECRET}")
    for error in (unknown, missing, tls):
        assert SECRET not in str(error.value)


def test_token_file_is_read_when_the_client_asks(tmp_path: Any) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    config = auth_config("token", f"file:{token_file}")
    assert config == AuthConfig("token-file", {"file": str(token_file)})
    assert pulsar_auth._token_file_reader(str(token_file))() == SECRET


def test_secrets_stay_out_of_repr_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = auth_config("basic", f"userId:milvus,password:{SECRET}")
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    assert "password" in repr(config)
    source = PulsarSource("pulsar://127.0.0.1:1", auth_plugin="token", auth_params=SECRET)
    assert SECRET not in repr(source)
    assert SECRET not in str(vars(source).get("_auth"))
    client = source.new_client()  # a real client: it connects lazily, nothing is sent
    client.close()
    assert SECRET not in caplog.text


# --- the reader over a fake pulsar-client ------------------------------------------------------
@dataclass
class FakeMessage:
    parts: MessageIdParts
    payload: bytes
    props: dict[str, str] = field(default_factory=dict)

    def message_id(self) -> Any:
        return cpp_id(self.parts)._msg_id

    def data(self) -> bytes:
        return self.payload

    def properties(self) -> dict[str, str]:
        return self.props


class FakeReader:
    def __init__(self, client: FakeClient, start: Any, inclusive: bool) -> None:
        self.client = client
        self.start = MessageIdParts.of(start)
        self.inclusive = inclusive
        self.connected = True
        self.closed = False
        if self.start == LATEST:
            self.queue = list(client.topic[-1:]) if inclusive else []
        else:  # the client's own filtering, as modelled above
            keep = set(model_reader([m.parts for m in client.topic], self.start))
            self.queue = [m for m in client.topic if m.parts in keep]
        self.queue += client.redeliver  # what a misbehaving client might send again

    def read_next(self, timeout_millis: int) -> FakeMessage:
        if self.client.read_error is not None:
            raise self.client.read_error
        if not self.queue:
            raise pulsar.Timeout("Pulsar error: TimeOut")
        return self.queue.pop(0)

    def has_message_available(self) -> bool:
        return bool(self.queue)

    def is_connected(self) -> bool:
        return self.connected

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeClient:
    topic: list[FakeMessage]
    create_errors: list[BaseException] = field(default_factory=list)
    read_error: BaseException | None = None
    redeliver: list[FakeMessage] = field(default_factory=list)
    readers: list[tuple[str, dict[str, Any], FakeReader]] = field(default_factory=list)
    closed: bool = False

    def create_reader(self, topic: str, start: Any, **kwargs: Any) -> FakeReader:
        if self.create_errors:
            raise self.create_errors.pop(0)
        reader = FakeReader(self, start, kwargs.get("start_message_id_inclusive", False))
        self.readers.append((topic, kwargs, reader))
        return reader

    def close(self) -> None:
        self.closed = True


def fake_topic() -> list[FakeMessage]:
    return [
        FakeMessage(parts, f"m{i}".encode(), {"msg_type": "Insert", "i": str(i)})
        for i, parts in enumerate(TOPIC)
    ]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient(fake_topic())
    monkeypatch.setattr(PulsarSource, "new_client", lambda self: client)
    return client


def position(parts: MessageIdParts, backend: str = ps.BACKEND) -> Position:
    return Position(backend, PCHANNEL, parts.serialize(), ts=1)


def test_reads_from_the_beginning_in_order(fake: FakeClient) -> None:
    source = PulsarSource("pulsar://broker:6650", "t", "ns")
    reader = source.open_channel(PCHANNEL, None)
    records = reader.read_batch(100, 0.01)
    assert [r.payload for r in records] == [f"m{i}".encode() for i in range(len(TOPIC))]
    assert [r.properties["i"] for r in records] == [str(i) for i in range(len(TOPIC))]
    assert all(r.pchannel == PCHANNEL for r in records)
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert [MessageIdParts.deserialize(r.msg_id) for r in records] == TOPIC
    assert [offset_of_msg_id(r.msg_id) for r in records] == offsets
    topic, kwargs, _ = fake.readers[0]
    assert topic == f"persistent://t/ns/{PCHANNEL}"
    assert kwargs["start_message_id_inclusive"] is False
    assert kwargs["is_read_compacted"] is False
    assert kwargs["receiver_queue_size"] == 16
    assert reader.read_batch(100, 0.01) == []
    reader.close()
    assert fake.closed


def test_batches_are_bounded(fake: FakeClient) -> None:
    reader = PulsarSource("broker:6650").open_channel(PCHANNEL, None)
    first = reader.read_batch(4, 0.01)
    rest = reader.read_batch(100, 0.01)
    assert [r.payload for r in first + rest] == [m.payload for m in fake.topic]
    assert len(first) == 4
    reader.close()


@pytest.mark.parametrize("start", TOPIC, ids=str)
def test_resume_after_a_position_repeats_nothing(fake: FakeClient, start: MessageIdParts) -> None:
    fake.redeliver = [m for m in fake.topic if m.parts <= start][-1:]  # a stale redelivery
    reader = PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, position(start))
    records = reader.read_batch(100, 0.01)
    assert [MessageIdParts.deserialize(r.msg_id) for r in records] == [
        m for m in TOPIC if m > start
    ]
    _, _, fake_reader = fake.readers[0]
    assert fake_reader.start == start
    reader.close()


def test_duplicates_are_dropped(fake: FakeClient, caplog: pytest.LogCaptureFixture) -> None:
    fake.redeliver = [fake.topic[2]]
    reader = PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, None)
    records = reader.read_batch(100, 0.01)
    assert len(records) == len(TOPIC)
    assert "dropped message" in caplog.text
    reader.close()


def test_seek_reopens_at_the_new_position(fake: FakeClient) -> None:
    reader = PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, position(TOPIC[5]))
    assert len(reader.read_batch(100, 0.01)) == len(TOPIC) - 6
    reader.seek(None)
    assert len(reader.read_batch(100, 0.01)) == len(TOPIC)
    reader.seek(position(TOPIC[1]))
    records = reader.read_batch(100, 0.01)
    assert MessageIdParts.deserialize(records[0].msg_id) == TOPIC[2]
    assert [r.closed for _, _, r in fake.readers] == [True, True, False]
    reader.close()
    assert fake.readers[-1][2].closed


def test_latest_and_earliest_positions(fake: FakeClient) -> None:
    reader = PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, position(LATEST))
    assert reader.read_batch(10, 0.01) == []
    fake.readers[0][2].queue.append(FakeMessage(MessageIdParts(11, 0), b"new"))
    assert [r.payload for r in reader.read_batch(10, 0.01)] == [b"new"]
    reader.seek(position(EARLIEST))
    assert len(reader.read_batch(100, 0.01)) == len(TOPIC)
    reader.close()


def test_a_position_of_another_backend_is_refused(fake: FakeClient) -> None:
    kafka = Position("kafka", PCHANNEL, (41).to_bytes(8, "little"), ts=1)
    with pytest.raises(ValueError, match="'kafka' position"):
        PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, kafka)
    with pytest.raises(ValueError, match="Pulsar message id"):
        PulsarSource("pulsar://broker:6650").open_channel(
            PCHANNEL, Position(ps.BACKEND, PCHANNEL, kafka.msg_id, 1)
        )
    assert fake.closed  # the shared client was released


def test_missing_topic_reads_nothing_until_it_exists(fake: FakeClient) -> None:
    fake.create_errors = [pulsar.TopicNotFound("Pulsar error: TopicNotFound")] * 2
    reader = PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, None)
    assert reader.read_batch(10, 0.0) == []
    assert len(reader.read_batch(100, 0.01)) == len(TOPIC)
    reader.close()


def test_broker_errors_are_source_unavailable(fake: FakeClient) -> None:
    fake.create_errors = [pulsar.ConnectError("Pulsar error: ConnectError")]
    source = PulsarSource("pulsar://broker:6650")
    with pytest.raises(SourceUnavailableError, match="ConnectError") as down:
        source.open_channel(PCHANNEL, None)
    assert down.value.retriable
    reader = source.open_channel(PCHANNEL, None)
    fake.read_error = pulsar.ConnectError("Pulsar error: ConnectError")
    with pytest.raises(SourceUnavailableError) as read_down:
        reader.read_batch(10, 0.01)
    assert read_down.value.retriable
    reader.close()


def test_refused_credentials_are_not_retried(fake: FakeClient) -> None:
    fake.create_errors = [pulsar.AuthenticationError("Pulsar error: AuthenticationError")]
    with pytest.raises(PulsarConfigError) as refused:
        PulsarSource("pulsar://broker:6650").open_channel(PCHANNEL, None)
    assert isinstance(refused.value, SourceUnavailableError)
    assert refused.value.retriable is False


def test_bad_address_is_a_configuration_error() -> None:
    with pytest.raises(PulsarConfigError, match="scheme"):
        PulsarSource("http2://broker:6650").new_client()


def test_a_lasting_disconnection_is_reported(fake: FakeClient) -> None:
    source = PulsarSource("pulsar://broker:6650", disconnect_grace_seconds=0.0)
    reader = source.open_channel(PCHANNEL, position(TOPIC[-1]))
    fake.readers[0][2].connected = False
    assert reader.read_batch(10, 0.0) == []  # the client reconnects by itself at first
    with pytest.raises(SourceUnavailableError, match="not connected"):
        reader.read_batch(10, 0.0)
    reader.close()


def test_readers_share_one_client(fake: FakeClient) -> None:
    source = PulsarSource("pulsar://broker:6650")
    one = source.open_channel("c_0", None)
    two = source.open_channel("c_1", None)
    one.close()
    one.close()  # idempotent
    assert not fake.closed
    two.close()
    assert fake.closed
    with pytest.raises(SourceUnavailableError, match="closed"):
        two.read_batch(1, 0.0)


def test_watermarks(fake: FakeClient) -> None:
    source = PulsarSource("pulsar://broker:6650")
    assert source.watermarks(PCHANNEL) == (TOPIC[0].offset, TOPIC[-1].offset + 1)
    assert all(reader.closed for _, _, reader in fake.readers)
    earliest, latest = (kwargs for _, kwargs, _ in fake.readers)
    assert earliest["start_message_id_inclusive"] is False
    assert latest["start_message_id_inclusive"] is True
    assert fake.closed


def test_watermarks_of_an_empty_or_missing_topic(fake: FakeClient) -> None:
    fake.topic = []
    assert PulsarSource("pulsar://broker:6650").watermarks(PCHANNEL) == (0, 0)
    fake.create_errors = [pulsar.TopicNotFound("Pulsar error: TopicNotFound")]
    assert PulsarSource("pulsar://broker:6650").watermarks(PCHANNEL) == (0, 0)
    fake.create_errors = [pulsar.ConnectError("Pulsar error: ConnectError")]
    with pytest.raises(SourceUnavailableError):
        PulsarSource("pulsar://broker:6650").watermarks(PCHANNEL)


def test_offset_of_is_the_record_offset() -> None:
    assert PulsarSource.offset_of(TOPIC[3].serialize()) == TOPIC[3].offset
