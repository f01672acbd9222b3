"""A target Milvus that was down passes the daemon's target check as soon as it answers again.

gRPC shares one subchannel per address among a process's channels: while the daemon's other
clients of the target (a runner's sink, the stale-write watch) keep trying an address that
refuses, that subchannel backs off (up to 120 s), and a new channel's first call fails at once
with UNAVAILABLE however long its timeout. A failback asked right after the lost cluster came
back was refused 400 "not reachable within 10 s" in 0.1 s (the boundary search on 1447c5d,
failover_reason x delete:other); the check now opens a connection of its own."""

from __future__ import annotations

import socket
import time

import pytest
from harness.cuttable_proxy import CuttableProxy
from pymilvus.client.grpc_handler import GrpcHandler

from server.errors import TargetUnreachableError
from server.tasks.target_check import check_target_reachable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_target_back_from_an_outage_passes_the_check_at_once(milvus_lite_service):
    port = free_port()
    connect = {"host": "127.0.0.1", "port": port, "connect_timeout": 10}
    # the daemon's other client of the target, trying to reach it through the outage
    other = GrpcHandler(uri=f"http://127.0.0.1:{port}")
    other._channel.subscribe(lambda _state: None, try_to_connect=True)
    try:
        for _ in range(3):  # down: refused, and said so
            with pytest.raises(TargetUnreachableError, match="is not reachable"):
                check_target_reachable(connect)
            time.sleep(1.0)
        with CuttableProxy(milvus_lite_service.host, milvus_lite_service.port, port=port):
            began = time.monotonic()
            assert check_target_reachable(connect)
            assert time.monotonic() - began < 10
    finally:
        other.close()
