"""Fixtures of the end-to-end tests: the target Milvus under test and clients of both sides."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pymilvus import MilvusClient


@dataclass
class Target:
    kind: str
    uri: str


@pytest.fixture(params=["milvus-lite", "milvus-2.3.5"])
def target(request) -> Target:
    """The target Milvus: Milvus Lite, or a real Milvus 2.3.5 standalone (the session's
    RocksMQ-backed server, which the Kafka-source tests do not otherwise touch)."""
    if request.param == "milvus-lite":
        return Target(request.param, request.getfixturevalue("milvus_lite_service").uri)
    return Target(request.param, request.getfixturevalue("milvus_source_rocksmq").uri)


@pytest.fixture
def source_client(milvus_source):
    client = MilvusClient(uri=milvus_source.uri, dedicated=True)
    yield client
    client.close()


@pytest.fixture
def target_milvus(target):
    client = MilvusClient(uri=target.uri, dedicated=True)
    yield client
    client.close()


@pytest.fixture
def target_client(milvus_lite_service):
    client = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    yield client
    client.close()


@pytest.fixture
def stream(kafka_mock):
    """A Milvus 2.6 source of 3 pchannels on the Kafka mock, written by the test writer (see
    tests/e2e/test_streaming_source.py), under a channel prefix of its own."""
    import uuid

    from harness.streaming_writer import StreamingWriter

    from tests.e2e.test_streaming_source import Stream

    writer = StreamingWriter(kafka_mock.bootstrap)
    source = Stream(writer, f"s26{uuid.uuid4().hex[:6]}", channels=3)
    source.tick_all()  # the topics exist before the task reads their ends
    yield source
    writer.close()


@pytest.fixture
def steady_writers(milvus_source):
    """Starts SteadyWriters (tests/e2e/test_crash.py) on source collections; every one is
    stopped at the end of the test, failed or not (a writer left running slows every later
    test of the session)."""
    from test_crash import SteadyWriter

    started: list[SteadyWriter] = []

    def start(collection: str) -> SteadyWriter:
        writer = SteadyWriter(milvus_source.uri, collection)
        writer.start()
        started.append(writer)
        return writer

    yield start
    for writer in started:
        writer.stop.set()
    for writer in started:
        writer.join(timeout=60)
