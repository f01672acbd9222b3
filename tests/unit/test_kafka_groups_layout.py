"""The channel groups of a Kafka target's task (replicator/sinks/kafka_groups.py): every
channel in exactly one group, the same groups at every start whatever order the channels are
listed in, balanced, and never an empty group."""

from __future__ import annotations

import random

import pytest

from replicator.sinks.kafka_groups import layout, pack, processes_of, unpack

CHANNELS = [f"by-dev-rootcoord-dml_{n}" for n in range(16)]


@pytest.mark.parametrize("processes", [1, 2, 3, 5, 16, 40])
def test_each_channel_in_one_group_stable_and_balanced(processes: int) -> None:
    groups = layout(CHANNELS, processes)
    flat = [c for g in groups for c in g]
    assert sorted(flat) == sorted(CHANNELS)  # each once
    assert len(groups) == min(processes, len(CHANNELS))
    assert all(groups) and max(map(len, groups)) - min(map(len, groups)) <= 1
    shuffled = CHANNELS[:]
    random.Random(7).shuffle(shuffled)
    assert layout(shuffled, processes) == groups


def test_processes_the_task_says_else_the_daemons() -> None:
    assert processes_of({}, 2) == 2
    assert processes_of({"processes": 1}, 2) == 1
    assert processes_of({"processes": 3}) == 3
    assert processes_of({}) == 1


def test_a_request_crosses_the_pipe_as_its_bytes() -> None:
    from pymilvus.grpc_gen import milvus_pb2

    request = milvus_pb2.HasCollectionRequest(db_name="d", collection_name="c")
    packed = pack(request)
    assert isinstance(packed, tuple) and packed[0] == "protobuf"
    assert unpack(packed) == request
    assert unpack(pack({"a": 1})) == {"a": 1}
