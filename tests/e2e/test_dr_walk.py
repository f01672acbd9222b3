"""A short seeded walk over disaster recovery (tests/harness/dr_walk.py; issue 41, Build item
6): cluster ``a`` a Milvus 2.3.5 of its own on the Kafka mock (killed and started again by the
walk), ``b`` the session's RocksMQ Milvus (never killed); a fleet on one etcd metastore; two
flows of one pair under a writer each. Every invariant is checked after every step.

The seed's walk: a switchover a -> b and home, a daemon killed at ``fencing`` (rolled back), a
daemon killed at ``reversed`` (finished), ``kill -9`` of a and a failover, a restarted, and a
fleet member killed at ``moving`` whose job the other member finishes. (At 235b3b5, before the
cluster-pair change, writers moved at ``reversing``: this seed's walk, with the fault points of
then, had a member killed at ``reversing`` at step 7, the job rolled back and the 685 writes the
writer had moved meanwhile were lost: ``acknowledged_on_primary``, issue 41 Build item 3.)

``CDC_WALK_SEED=<seed>`` runs the walk of that seed (a failing walk prints its seed and steps);
``bench/dr_walk.py`` runs long walks of any seed.
"""

from __future__ import annotations

import uuid

import pytest
from harness.dr_walk import ClusterHandle, Walk, walk_seed
from harness.milvus_source import restartable_milvus

from replicator.config.connections import SourceSettings
from server.dr.fence import EtcdQuotaFence, wait_in_effect

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # 3-5 min on a loaded machine

SEED = 4129
STEPS = 7


def test_a_seeded_walk_keeps_every_invariant_after_every_step(
    daemon_factory, milvus_source_rocksmq, etcd_service, kafka_mock, tmp_path
):
    seed = walk_seed(SEED)
    root = f"walk-a-{uuid.uuid4().hex[:8]}"
    with restartable_milvus(
        tmp_path / "milvus-a",
        etcd_service.endpoint,
        kafka_bootstrap=kafka_mock.bootstrap,
        root_path=root,
    ) as lost:
        walk = Walk(
            seed=seed,
            clusters={
                "a": ClusterHandle("a", lost.source, lost),
                "b": ClusterHandle("b", milvus_source_rocksmq),
            },
            etcd_endpoint=etcd_service.endpoint,
            make_daemon=daemon_factory,
            workdir=tmp_path,
        )
        try:
            walk.setup(home="a")
            result = walk.run(STEPS)
        finally:
            walk.close()
            # b serves the rest of the session: a fence the walk left there must not outlive it
            fence = EtcdQuotaFence("b", SourceSettings(**walk.cluster_settings["b"]))
            if fence.is_set():
                fence.lift()
            wait_in_effect(fence, 60, lambda: False, effect=False)
    assert [s.index for s in result.steps] == list(range(1, STEPS + 1)), result.steps
    assert len(result.checks) == 6, result.checks  # every invariant, after every step
    assert all(result.checks[name] == STEPS + 1 for name in result.checks), result.checks
