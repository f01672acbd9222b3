"""Fences with owners (server/dr/fence_owners.py) against a real etcd: the cluster's
``forceDeny`` key is written only where absent, by the pair's first owner, lifted by its last
owner with a transaction conditioned on the revision the pair wrote; the operator's key is never
lifted; a fence whose job is gone is lifted by ``lift_ownerless``, also when the job stopped
before recording the revision it wrote; a fence being lifted is not joined."""

from __future__ import annotations

import threading
import time
import uuid

import etcd3
import pytest

from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.settings import CdcSettings
from server.dr.fence import FenceCancelledError, FenceError
from server.dr.fence_owners import PairFences
from server.dr.flows import FAULT_ENV
from server.dr.pair import ClusterPair, FenceHold, PairStore

pytestmark = pytest.mark.integration


@pytest.fixture
def world(etcd_service, tmp_path):
    roots = {name: f"fence-{name}-{uuid.uuid4().hex[:8]}" for name in ("a", "b")}
    settings = CdcSettings(
        clusters={
            name: {"etcd": {"address": [etcd_service.endpoint]}, "etcdRootPath": root}
            for name, root in roots.items()
        }
    )
    store = SqlMetaStore(sqlite_url(tmp_path / "meta.db"), root_path="fences")
    host, port = etcd_service.endpoint.split("//")[-1].rsplit(":", 1)
    etcd = etcd3.client(host=host, port=int(port))
    keys = {
        name: f"{root}/config/quotaAndLimits/limitWriting/forceDeny" for name, root in roots.items()
    }
    pairs = PairStore(store)
    yield PairFences(pairs, settings, ("a", "b")), pairs, etcd, keys
    etcd.close()
    store.close()


def hold(pairs: PairStore, cluster: str) -> FenceHold | None:
    return pairs.get("a", "b").fences.get(cluster)


def test_two_jobs_share_one_fence_and_the_last_one_lifts_it(world):
    fences, pairs, etcd, keys = world
    first = fences.acquire("a", "job-1")
    value, meta = etcd.get(keys["a"])
    assert value == b"true" and first.revision == meta.mod_revision and not first.operator
    second = fences.acquire("a", "job-2")  # a second switchover of the pair: joins, no write
    assert etcd.get(keys["a"])[1].mod_revision == first.revision
    assert hold(pairs, "a").owners == ("job-1", "job-2") and second.revision == first.revision
    fences.release("a", "job-1")
    assert etcd.get(keys["a"])[0] == b"true", "lifted while job-2 still holds it"
    fences.release("a", "job-2")
    assert etcd.get(keys["a"])[0] is None and hold(pairs, "a") is None
    fences.release("a", "job-2")  # again: nothing held, nothing done
    assert etcd.get(keys["b"])[0] is None


def test_the_operators_fence_is_recorded_as_theirs_and_never_lifted(world):
    fences, pairs, etcd, keys = world
    etcd.put(keys["a"], "true")  # the operator stopped writes first
    got = fences.acquire("a", "job-1")
    assert got.operator and got.revision == 0
    fences.release("a", "job-1")
    assert etcd.get(keys["a"])[0] == b"true" and hold(pairs, "a") is None
    etcd.put(keys["b"], "false")  # the operator's explicit setting is not overwritten
    with pytest.raises(FenceError, match=r"forceDeny .* is set to 'false' by someone else"):
        fences.acquire("b", "job-2")
    assert etcd.get(keys["b"])[0] == b"false" and hold(pairs, "b") is None


def test_a_key_rewritten_since_the_pair_wrote_it_is_left(world):
    fences, pairs, etcd, keys = world
    fences.acquire("a", "job-1")
    etcd.put(keys["a"], "true")  # the operator took it over: a new revision
    fences.release("a", "job-1")
    assert etcd.get(keys["a"])[0] == b"true" and hold(pairs, "a") is None


def test_a_fence_whose_job_is_gone_is_lifted_by_the_next_round(world):
    fences, pairs, etcd, keys = world
    fences.acquire("a", "job-1")
    fences.acquire("b", "job-2")
    assert fences.lift_ownerless({"job-1", "job-2"}) == []  # both running: nothing lifted
    assert etcd.get(keys["a"])[0] == b"true"
    assert fences.lift_ownerless({"job-2"}) == []  # job-1 died (its task deleted, say)
    assert etcd.get(keys["a"])[0] is None and hold(pairs, "a") is None
    assert etcd.get(keys["b"])[0] == b"true" and hold(pairs, "b").owners == ("job-2",)


def test_a_job_that_stopped_before_recording_its_revision_is_cleaned_up(world):
    fences, pairs, etcd, keys = world
    _, _, _, before = fences.fence("a").read()
    # as a job leaves it when killed between recording itself as the writer and the revision
    pairs.update("a", "b", lambda p: p.with_fence("a", FenceHold(("job-1",), 0, before)))
    fences.fence("a").create()
    assert fences.lift_ownerless(set()) == []
    assert etcd.get(keys["a"])[0] is None and hold(pairs, "a") is None
    # an operator's key from before the job's read is left
    etcd.put(keys["b"], "true")
    _, _, _, after = fences.fence("b").read()
    pairs.update("a", "b", lambda p: p.with_fence("b", FenceHold(("job-2",), 0, after)))
    assert fences.lift_ownerless(set()) == []
    assert etcd.get(keys["b"])[0] == b"true" and hold(pairs, "b") is None


def test_a_fence_being_lifted_is_not_joined_until_it_is_gone(world, monkeypatch):
    fences, pairs, etcd, keys = world
    first = fences.acquire("a", "job-1")
    pairs.update(
        "a", "b", lambda p: p.with_fence("a", FenceHold((), first.revision, 0, lifting=True))
    )
    got: list[FenceHold] = []
    joiner = threading.Thread(target=lambda: got.append(fences.acquire("a", "job-2")))
    joiner.start()
    time.sleep(1.0)
    assert not got, "joined a fence being lifted"
    assert fences.lift_ownerless(set()) == []  # the lifter's round finishes
    joiner.join(10)
    assert got and got[0].owners == ("job-2",) and got[0].revision > first.revision
    assert etcd.get(keys["a"])[0] == b"true"
    monkeypatch.setattr("server.dr.fence_owners.JOIN_WAIT", 0.5)
    pairs.update("a", "b", lambda p: p.with_fence("b", FenceHold((), 7, 0, lifting=True)))
    with pytest.raises(FenceError, match="cluster b is being lifted and was not gone"):
        fences.acquire("b", "job-3")


def test_a_lift_that_fails_stays_recorded_and_is_retried(world, etcd_service):
    fences, pairs, etcd, keys = world
    fences.acquire("a", "job-1")
    broken = CdcSettings(
        clusters={"a": {"etcd": {"address": ["127.0.0.1:1"]}, "etcdRootPath": "x"}}
    )
    unreachable = PairFences(pairs, broken, ("a", "b"))
    with pytest.raises(FenceError, match="cluster a's etcd"):
        unreachable.release("a", "job-1")
    assert hold(pairs, "a").lifting and etcd.get(keys["a"])[0] == b"true"
    problems = unreachable.lift_ownerless(set())
    assert len(problems) == 1 and "cluster a's etcd" in problems[0]
    assert fences.lift_ownerless(set()) == []  # etcd reachable again
    assert etcd.get(keys["a"])[0] is None and hold(pairs, "a") is None


def test_pair_records_round_trip():
    pair = ClusterPair(("a", "b"), {}, {"a": FenceHold(("j",), 5, 3, False, True)})
    assert ClusterPair.from_bytes(pair.to_bytes()) == pair


@pytest.mark.parametrize("killed", [False, True], ids=["wakes", "killed-after-its-write"])
def test_a_fence_given_up_before_its_first_owner_writes_it_is_never_written(
    world, monkeypatch, tmp_path, killed
):
    """D1 joins as the fence's first owner and stalls before writing the key; D2 takes the job
    over and rolls it back: no key yet, the hold forgotten. D1 wakes and would write the key
    (issue 48, fault 5: forceDeny stayed on a with no record, and no recover round lifted it).
    Fault 5's first fix had D1 find its hold gone and delete the key again, which a kill right
    after the write (``killed``: the boundary search's kill at ``fence-unheld``) still left
    behind. D2's lift now marks the hold given up in a's etcd, in one transaction with the key's
    absence, and D1's write, in one transaction with the mark's absence, writes nothing."""
    fences, pairs, etcd, keys = world
    wake = tmp_path / "wake"
    killing = ",fail:fence-unheld" if killed else ""  # an error there: nothing after it runs
    monkeypatch.setenv(FAULT_ENV, f"hold:fence-joined:30:{wake}{killing}")
    outcome: list[object] = []

    def stalled_member() -> None:
        try:
            outcome.append(fences.acquire("a", "job-1"))
        except Exception as exc:  # noqa: BLE001 - the outcome is the test's
            outcome.append(exc)

    d1 = threading.Thread(target=stalled_member)
    d1.start()
    deadline = time.monotonic() + 10
    while hold(pairs, "a") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hold(pairs, "a").owners == ("job-1",) and etcd.get(keys["a"])[0] is None
    assert fences.release("a", "job-1")  # D2's roll back: the last owner lifts (no key yet)
    assert hold(pairs, "a") is None
    wake.touch()
    d1.join(30)
    assert etcd.get(keys["a"])[0] is None, "a forceDeny stayed with no hold recording it"
    assert isinstance(outcome[0], FenceCancelledError), outcome[0]
    assert "given up" in str(outcome[0])
    assert hold(pairs, "a") is None
    assert fences.lift_ownerless(set()) == []
