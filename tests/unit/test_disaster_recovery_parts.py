"""The parts of disaster recovery that need no server: named clusters in the configuration and
in create requests, consistent-up-to of channels and tasks, the switchover record, the reverse
request, and how a fenced Milvus's refusal is read (the e2e tests run them on two real Milvus
2.3.5: tests/e2e/test_disaster_recovery.py)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from replicator.compare.classify import RangeRead
from replicator.compare.state import VerifyJob
from replicator.config.redaction import secret_values
from replicator.config.settings import ConfigError, load_settings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import from_seconds
from replicator.pipeline.status import (
    ChannelStatus,
    consistent_view,
    task_consistent_ts,
)
from replicator.sinks.milvus_status import status_retriable
from server.dr.failover_export import ChannelTail, Unreplicated
from server.dr.fence import EtcdQuotaFence, FenceError, is_write_refusal, wait_in_effect
from server.dr.flows import VerifyWaitError, reverse_request, verify_ended
from server.dr.record import SwitchoverJob
from server.dr.stale_watch import Found, StaleWriteWatch, WatchState
from server.errors import BadRequestError
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.spec import validate_create

CLUSTERS = {
    "clusters": {
        "east": {
            "etcd": {"address": ["http://10.0.0.1:2379"], "rootPath": "east"},
            "kafka": {"address": "10.0.0.1:9092"},
            "milvus": {"uri": "http://10.0.0.1:19530", "username": "root", "password": "Ea5t-pw!"},
        },
        "west": {
            "etcd": {"address": ["http://10.0.0.2:2379"], "rootPath": "west"},
            "rocksmq": {"path": "/var/lib/milvus/rdb_data"},
            "milvus": {"uri": "http://10.0.0.2:19530", "token": "We5t-token-xyz"},
        },
        "nomilvus": {"etcd": {"address": ["http://10.0.0.3:2379"]}},
    }
}


def settings(extra: dict | None = None):
    path = Path(tempfile.gettempdir()) / f"cdc-dr-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump({**CLUSTERS, **(extra or {})}))
    try:
        return load_settings(str(path), {})
    finally:
        path.unlink()


def create(**data):
    data.setdefault("collection_infos", [{"name": "*"}])
    return validate_create(parse_model(CreateRequest, data), settings()).to_stored()


# --- named clusters ----------------------------------------------------------------------------
def test_a_task_between_named_clusters_takes_the_targets_endpoint_from_the_configuration():
    spec = create(source_cluster="east", target_cluster="west")
    assert (spec["source_cluster"], spec["target_cluster"]) == ("east", "west")
    assert spec["milvus_connect_param"]["uri"] == "http://10.0.0.2:19530"
    assert spec["milvus_connect_param"]["token"] == "We5t-token-xyz"
    # the replicate channel is the source cluster's
    assert spec["rpc_channel_info"]["name"] == "east-replicate-msg"
    assert "We5t-token-xyz" not in str(TaskSpec.from_stored(spec).public_view())


def test_the_default_source_is_not_stored_and_a_go_tool_body_is_unchanged():
    spec = create(milvus_connect_param={"uri": "http://10.9.9.9:19530"})
    assert "source_cluster" not in spec and "target_cluster" not in spec
    spec = create(source_cluster="sourceConfig", milvus_connect_param={"uri": "http://t:19530"})
    assert "source_cluster" not in spec


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"source_cluster": "north", "target_cluster": "west"}, "no cluster named 'north'"),
        ({"source_cluster": "east", "target_cluster": "east"}, "'east' is the task's source"),
        (
            {"target_cluster": "west", "milvus_connect_param": {"uri": "http://x:19530"}},
            "give one target",
        ),
        ({"source_cluster": "east", "target_cluster": "nomilvus"}, "nomilvus.milvus.uri"),
        ({"target_cluster": "sourceConfig"}, "'sourceConfig' is the task's source"),
        ({"source_cluster": "east", "target_cluster": "sourceConfig"}, "has no Milvus endpoint"),
    ],
)
def test_a_bad_pair_of_clusters_is_refused_by_name(data, message):
    with pytest.raises(BadRequestError, match=message):
        create(**data)


def test_cluster_names_are_checked_and_their_secrets_redacted():
    with pytest.raises(ConfigError, match="not a cluster name"):
        settings({"clusters": {"sourceConfig": {}}})
    with pytest.raises(ConfigError, match="not a cluster name"):
        settings({"clusters": {"bad name": {}}})
    loaded = settings()
    assert {"Ea5t-pw!", "We5t-token-xyz"} <= set(secret_values(loaded))
    with pytest.raises(KeyError, match="clusters: east, nomilvus, west"):
        loaded.cluster("north")
    assert loaded.source_of(TaskSpec.from_stored({"source_cluster": "west"})).mq_type == "rocksmq"
    assert loaded.source_of(TaskSpec.from_stored({})) is loaded.sourceConfig


# --- consistent-up-to --------------------------------------------------------------------------
def test_a_channel_is_consistent_up_to_its_applied_tick_or_while_caught_up_its_last_tick():
    status = ChannelStatus("dml_0")
    assert status.consistent_ts == 0
    status.applied(from_seconds(1000.0))
    assert status.consistent_ts == from_seconds(1000.0)
    # a read begun long after the last tick claims that tick, not the moment of the read
    status.mark_caught_up(from_seconds(1000.2), read_started=2000.0)
    assert status.consistent_ts == from_seconds(1000.2)
    assert status.caught_up_at == 2000.0
    status.caught_up = False  # records arrived: only the applied tick counts again
    assert status.consistent_ts == from_seconds(1000.0)


def test_a_channel_that_never_ticked_bounds_nothing_and_claims_nothing():
    ticking, empty = ChannelStatus("dml_0"), ChannelStatus("dml_1")
    ticking.mark_caught_up(from_seconds(1000.0), read_started=5000.0)
    assert task_consistent_ts([ticking, empty]) == 0  # dml_1 not read to its end yet
    empty.mark_caught_up(0, read_started=5000.0)
    assert empty.holds_nothing and empty.consistent_ts == 0
    assert task_consistent_ts([ticking, empty]) == from_seconds(1000.0)
    assert task_consistent_ts([empty]) == 0  # no tick anywhere: nothing is proven


def test_a_task_is_consistent_up_to_its_slowest_channel_and_unknown_while_one_is():
    fast, slow, replicate = (
        ChannelStatus("dml_0"),
        ChannelStatus("dml_1"),
        ChannelStatus("rpc", has_ticks=False),
    )
    fast.applied(from_seconds(1000.0))
    assert task_consistent_ts([fast, slow, replicate]) == 0  # dml_1 has not told yet
    slow.applied(from_seconds(990.0))
    assert task_consistent_ts([fast, slow, replicate]) == from_seconds(990.0)
    view = consistent_view(from_seconds(990.0))
    assert view == {"ts": from_seconds(990.0), "time": "1970-01-01T00:16:30.000Z"}
    assert consistent_view(0) is None


def test_a_failover_channel_claims_its_ticks_below_its_first_unapplied_record():
    t = from_seconds
    quiet = ChannelTail("dml_0", saved_ts=t(100.0), last_tick=t(100.6))
    assert quiet.consistent_ts == t(100.6)  # nothing unapplied: its last tick read
    cut = ChannelTail("dml_1", saved_ts=t(100.0), last_tick=t(100.4), first_unapplied=t(100.5))
    assert cut.consistent_ts == t(100.4)  # a write after the last tick: that tick
    early = ChannelTail("dml_2", saved_ts=t(100.0), last_tick=t(101.0), first_unapplied=t(100.5))
    early.records = 1
    assert early.consistent_ts == t(100.5) - 1  # the tick is past a write the target lacks
    unused = ChannelTail("dml_3", saved_ts=0)
    assert not unused.bounds_task  # no tick, nothing unapplied: no collection on it
    lost = ChannelTail("dml_4", saved_ts=0, first_unapplied=t(100.2))
    lost.records = 1
    assert lost.bounds_task and lost.consistent_ts == 0  # a write and no tick: nothing proven
    export = Unreplicated(channels=[quiet, cut, early, unused])
    assert export.consistent_ts == t(100.4)
    assert export.unapplied_from == t(100.5)
    assert Unreplicated(channels=[quiet, lost]).consistent_ts == 0


# --- switchover ----------------------------------------------------------------------------------
def test_a_switchover_record_keeps_its_steps_and_reads_back_as_written():
    job = SwitchoverJob.new("t1", "host:8444", 30.0, 600.0, ("east", "west"))
    job = job.to("fencing", fence_set=True).to("failed", reason="x", rolled_back=True)
    assert [s["state"] for s in job.steps] == ["checking", "fencing", "failed"]
    assert job.finished and job.finished_at >= job.started_at
    assert SwitchoverJob.from_bytes(job.to_bytes()) == job
    assert job.view()["started_at"].endswith("Z")


def test_the_reverse_request_swaps_the_ends_keeps_the_selection_and_starts_at_the_end():
    spec = create(
        source_cluster="east",
        target_cluster="west",
        collection_infos=None,
        db_collections={"shop": [{"name": "orders"}]},
    )
    request = reverse_request(TaskSpec.from_stored(spec), "t1-rev")
    reverse = validate_create(request, settings()).to_stored()
    assert (reverse["source_cluster"], reverse["target_cluster"]) == ("west", "east")
    assert reverse["db_collections"] == spec["db_collections"]
    assert reverse["start_at"] == "end"
    assert reverse["milvus_connect_param"]["password"] == "Ea5t-pw!"


def test_a_fenced_milvus_refusal_is_recognised_and_retried_by_tasks_writing_there():
    # what Milvus 2.3.5 answered a write while quotaAndLimits.limitWriting.forceDeny was true
    refusal = (
        "<MilvusException: (code=9, message=quota exceeded[reason=the writing has been "
        "deactivated by the administrator])>"
    )
    assert is_write_refusal(Exception(refusal))
    assert not is_write_refusal(Exception("collection not found[collection=x]"))
    # back-pressure that is not the fence proves nothing (it would set fenced_at early)
    for other in (
        "<MilvusException: (code=9, message=quota exceeded[reason=memory quota exhausted])>",
        "<MilvusException: (code=9, message=quota exceeded[reason=disk quota exceeded])>",
        "<MilvusException: (code=8, message=rate limit exceeded[rate=0.1])>",
    ):
        assert not is_write_refusal(Exception(other)), other
    assert status_retriable(9, 48)  # a task writing to a fenced target waits, never fails


def test_a_probe_that_cannot_write_is_a_fence_error_that_ends_the_wait():
    """A probe write that fails otherwise than by the fence's refusal (the cluster down, a
    lost connection) is a FenceError naming the cluster and the cause: the job's roll back
    and finish handle FenceError, not pymilvus's exceptions."""
    from pymilvus.exceptions import MilvusException

    probes = []

    def probe() -> bool:
        probes.append(time.monotonic())
        raise MilvusException(code=2, message="Fail connecting to server on 10.0.0.1:19530")

    fence = EtcdQuotaFence("east", settings().cluster("east"), probe)
    with pytest.raises(FenceError, match=r"cluster east: the probe write could not be made: "):
        fence.in_effect()
    with pytest.raises(FenceError, match="Fail connecting to server"):
        wait_in_effect(fence, 30, lambda: False, effect=False)
    assert len(probes) == 2  # the wait ended at the first failed probe, not at its timeout


class _Verifies:
    """What ``verify_ended`` reads of the supervisor: the task's latest verify job."""

    def __init__(self, *jobs: VerifyJob) -> None:
        self.jobs = list(jobs)

    def verify_job(self, task_id: str) -> VerifyJob | None:
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]


def test_a_verify_wait_ends_with_its_result_at_its_deadline_or_when_replaced():
    running = VerifyJob("v1", ["*"], state="running", started_at=1.0)
    done = running.with_(state="done")
    other = VerifyJob("v2", ["*"], state="running", started_at=2.0)

    async def ended(sup: _Verifies, budget: float) -> VerifyJob:
        return await verify_ended(sup, "t1", "v1", budget, poll=0.01)  # type: ignore[arg-type]

    assert asyncio.run(ended(_Verifies(running, running, done), 5)).state == "done"
    with pytest.raises(VerifyWaitError, match=r"verify v1 of task t1 not ended in 0\.2 s"):
        asyncio.run(ended(_Verifies(running), 0.2))
    # another verify of the task (a restart asked one, an operator did): v1's result is unknown
    with pytest.raises(VerifyWaitError, match="verify v1 of task t1 was replaced by v2"):
        asyncio.run(ended(_Verifies(running, other), 5))


def _stale_state() -> WatchState:
    return WatchState("b-to-a", "a", "b", "job1", "2026-11-27T00:00:00.000Z")


def test_a_stale_key_read_again_counts_once_unless_its_rows_changed():
    state = _stale_state()
    # an upsert's delete and insert read in two rounds: the same key, the same two rows
    first = RangeRead({30: 1, 31: 2}, {30: 9})  # 30 different, 31 missing on the watched side
    counted = StaleWriteWatch._new(state, "default.c", first.divergence, first)
    assert counted.keys == {30, 31}
    again = StaleWriteWatch._new(state, "default.c", first.divergence, first)
    assert not again
    # the stale client writes key 30 once more, otherwise: a new stale write
    changed = RangeRead({30: 1, 31: 2}, {30: 8})
    assert StaleWriteWatch._new(state, "default.c", changed.divergence, changed).keys == {30}


def test_the_watch_record_survives_a_round_trip_and_shows_what_it_found():
    state = _stale_state()
    state.stale["default.c"] = Found(extra=5, missing=1, sample=[90_000, "k"])
    state.pending["default.c"] = [[1, 2], ["x", 3]]
    state.counted["default.c"] = [[30, "1:9"]]
    back = WatchState.from_bytes(state.to_bytes())
    assert back == state
    view = back.view()
    assert view["stale_rows"] == 6 and view["keys_pending"] == 2
    assert view["collections"]["default.c"]["rows"] == 6
    assert "positions" not in view and "counted" not in view
