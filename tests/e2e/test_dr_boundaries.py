"""A rotating part of the boundary search (tests/harness/dr_boundaries.py; issue 48, Build item
2): a switchover held right after one of its durable writes and every operator verb asked there
(pause, resume, delete, switchover, failover, failback of either task of the flow, the request
again), judged in one held world while they are refused (tests/harness/dr_verb_batch.py), at one
boundary (13 combinations), and a kill at another; then the walk's invariants, the verbs'
answers (2xx, or 409 naming the state) and the flow driven home by verbs alone. (One boundary
of verbs a day, not two: the test was the suite's longest, 371 s of a 28-minute run; the
bench runs them all.) Cluster ``a`` is
a Milvus 2.3.5 of its own on the Kafka mock, ``b`` the session's RocksMQ Milvus; a fleet on one
etcd metastore.

The boundaries are drawn by the date (``CDC_BOUNDARY_SEED=<seed>`` draws that seed's), and
printed; stalls (a minute each), failovers and failbacks (a failback takes a minute or more) are
left to ``bench/dr_boundaries.py``, which runs every combination.
"""

from __future__ import annotations

import pytest
from harness.dr_boundaries import BoundarySearch, boundary_seed, rotating, table
from harness.dr_walk import suite_walk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_rotating_boundaries_keep_every_invariant_under_every_verb_and_a_kill(
    daemon_factory, milvus_source_rocksmq, etcd_service, kafka_mock, tmp_path
):
    seed = boundary_seed()
    batches, kill = rotating(seed)
    print(f"boundary cases of seed {seed} (CDC_BOUNDARY_SEED):")
    for case in (*(c for batch in batches for c in batch), kill):
        print(f"  {case.label()}")
    with suite_walk(
        seed,
        make_daemon=daemon_factory,
        rocksmq=milvus_source_rocksmq,
        etcd_endpoint=etcd_service.endpoint,
        kafka_bootstrap=kafka_mock.bootstrap,
        workdir=tmp_path,
        keep_going=True,
    ) as walk:
        search = BoundarySearch(walk, tmp_path / "holds")
        search.prepare_fleet()
        walk.setup(home="a", flows=1)
        print(f"warm-up (a task each way): {search.round_trip()}")
        results = [r for batch in batches for r in search.run_verbs(batch)]
        results.append(search.run(kill))
    print("\n".join(table(results)))
    # a point a job may not pass (reverse_deleted: only a flow with a task that way) is shown
    assert any(r.held for r in results), "\n".join(table(results))
    asked = [r for r in results if r.answers]
    assert asked or not any(r.held for r in results[:-1]), "no verb asked where a job held"
    broken = [f"{r.case.label()}: {b}" for r in results for b in r.broke]
    assert not broken, "\n".join(broken)
    assert len(walk.result.checks) == 9, walk.result.checks  # every invariant was checked
