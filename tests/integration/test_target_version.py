"""The target's version is read again once its connection is made anew: a Milvus Lite replaced
behind the same address by a real Milvus 2.3.5 (the TCP proxy redirected, its connections
closed) is known as 2.3.5 at the next DDL, and the version matrix stops what 2.3.5 cannot hold
(it used to be taken for the Lite it had answered once, and the collection was made there).
The Milvus 2.3.5 of the `milvus` wheel answers "v2.3.5-lite"."""

from __future__ import annotations

import uuid

import pytest
from harness.cuttable_proxy import CuttableProxy
from harness.services import wait_until
from pymilvus import MilvusClient
from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetUnavailableError, TaskFailedError
from replicator.sinks.milvus import MilvusTarget

pytestmark = pytest.mark.integration

S = schema_pb2


def schema(name: str, *, nullable: bool = False) -> schema_pb2.CollectionSchema:
    made = S.CollectionSchema(name=name)
    made.fields.add(name="id", data_type=S.Int64, is_primary_key=True)
    vec = made.fields.add(name="vec", data_type=S.FloatVector)
    vec.type_params.add(key="dim", value="4")
    made.fields.add(name="note", data_type=S.VarChar, nullable=nullable)
    made.fields[-1].type_params.add(key="max_length", value="64")
    return made


def answers(target: MilvusTarget, name: str) -> bool:
    try:
        return not target.has_collection("default", name)
    except TargetUnavailableError:
        return False


def test_a_target_replaced_behind_its_address_is_known_by_its_new_version(
    milvus_lite_service, milvus_source_rocksmq
):
    lite, old = milvus_lite_service, milvus_source_rocksmq
    first, second = f"tv_{uuid.uuid4().hex[:8]}", f"tv_{uuid.uuid4().hex[:8]}"
    with CuttableProxy("127.0.0.1", lite.port) as proxy:
        target = MilvusTarget({"uri": f"http://127.0.0.1:{proxy.port}"}, timeout=30)
        try:
            assert target.create_collection("default", first, schema(first, nullable=True), 1)
            assert target.target().kind == "lite"

            proxy.redirect("127.0.0.1", old.port)  # a Milvus 2.3.5 now answers there
            # a call on the closed connection may fail (UNAVAILABLE) before gRPC connects anew:
            # a task retries it, as here
            wait_until(lambda: answers(target, second), 30, "the target reached again")
            with pytest.raises(TaskFailedError) as stopped:
                target.create_collection("default", second, schema(second, nullable=True), 1)
            assert str(stopped.value) == (
                f"collection default.{second}: the target (Milvus 2.3.5-lite) cannot hold field "
                "note (VarChar, nullable; nullable field is held from Milvus 2.5.0) of the "
                "source's schema, so the collection is not created there: replicate to a target "
                "that supports the type, or leave the collection out of the task"
            )
            assert str(target.target()) == "Milvus 2.3.5-lite"  # the milvus wheel's build
        finally:
            target.close()
    for server in (lite, old):
        client = MilvusClient(uri=server.uri, dedicated=True)
        try:
            assert not client.has_collection(second)
            if client.has_collection(first):
                client.drop_collection(first)
        finally:
            client.close()
