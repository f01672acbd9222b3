"""A rotating few of the boundary search's cases (tests/harness/dr_boundaries.py; issue 48,
Build item 2): a switchover held right after one of its durable writes, a fault there (a kill,
an operator's verb on either task of the flow, the request asked again), then the walk's
invariants, the verbs' answers (2xx, or 409 naming the state) and the flow driven home by verbs
alone. Cluster ``a`` is a Milvus 2.3.5 of its own on the Kafka mock, ``b`` the session's
RocksMQ Milvus; a fleet on one etcd metastore.

The cases are drawn by the date (``CDC_BOUNDARY_SEED=<seed>`` draws that seed's), and printed;
stalls (a minute each), failovers and failbacks (a failback takes a minute or more) are left to
``bench/dr_boundaries.py``, which runs every combination.
"""

from __future__ import annotations

import uuid

import pytest
from harness.dr_boundaries import BoundarySearch, boundary_seed, rotating, table
from harness.dr_walk import ClusterHandle, Walk
from harness.milvus_source import restartable_milvus

from replicator.config.connections import SourceSettings
from server.dr.fence import EtcdQuotaFence, wait_in_effect

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CASES = 3  # about 20-40 s each here, a minute on a loaded machine


def test_a_rotating_few_boundaries_keep_every_invariant(
    daemon_factory, milvus_source_rocksmq, etcd_service, kafka_mock, tmp_path
):
    seed = boundary_seed()
    cases = rotating(CASES, seed)
    print(f"boundary cases of seed {seed} (CDC_BOUNDARY_SEED):")
    for case in cases:
        print(f"  {case.label()}")
    root = f"bnd-a-{uuid.uuid4().hex[:8]}"
    with restartable_milvus(
        tmp_path / "milvus-a",
        etcd_service.endpoint,
        kafka_bootstrap=kafka_mock.bootstrap,
        root_path=root,
    ) as home:
        walk = Walk(
            seed=seed,
            clusters={
                "a": ClusterHandle("a", home.source, home),
                "b": ClusterHandle("b", milvus_source_rocksmq),
            },
            etcd_endpoint=etcd_service.endpoint,
            make_daemon=daemon_factory,
            workdir=tmp_path,
            keep_going=True,
        )
        search = BoundarySearch(walk, tmp_path / "holds")
        try:
            search.prepare_fleet()
            walk.setup(home="a", flows=1)
            results = [search.run(case) for case in cases]
        finally:
            walk.close()
            # b serves the rest of the session: a fence left there must not outlive the test
            fence = EtcdQuotaFence("b", SourceSettings(**walk.cluster_settings["b"]))
            if fence.is_set():
                fence.lift()
            wait_in_effect(fence, 60, lambda: False, effect=False)
    print("\n".join(table(results)))
    # a point a job may not pass (reverse_deleted: only a flow with a task that way) is shown
    assert any(r.held for r in results), "\n".join(table(results))
    broken = [f"{r.case.label()}: {b}" for r in results for b in r.broke]
    assert not broken, "\n".join(broken)
    assert len(walk.result.checks) == 7, walk.result.checks  # every invariant was checked
