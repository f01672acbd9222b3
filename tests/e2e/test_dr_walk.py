"""A short seeded walk over disaster recovery (tests/harness/dr_walk.py; issue 41, Build item
6): cluster ``a`` a Milvus 2.3.5 of its own on the Kafka mock (killed and started again by the
walk), ``b`` the session's RocksMQ Milvus (never killed); a fleet on one etcd metastore; two
flows of one pair, at home on b, under a writer each. Every invariant is checked after every
step.

The walk begins with the operator's sequence of issue 41 (there on clusters a and b the other
way round: here b is home and a the cluster that can be killed): a switchover of f1 to a, the
writer moved there; a switchover back with the daemon killed mid-way (rolled back: a stays the
primary); ``kill -9`` of a under the writer and a failover of the a -> b task; a started again;
a failback of f1 (it used to be refused, 409 "overlapping", by the a -> b task of the first
step, paused since: now the flow's task is re-used). Then the seed's steps.

``CDC_WALK_SEED=<seed>`` runs the walk of that seed (a failing walk prints its seed and steps);
``bench/dr_walk.py`` runs long walks of any seed.
"""

from __future__ import annotations

import re

import pytest
from harness.dr_walk import suite_walk, walk_seed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # 3-5 min on a loaded machine

SEED = 4129
STEPS = 8
# (kind, move, point): issue 41's operator's sequence, cluster labels swapped
OPERATORS_SEQUENCE = (
    ("switchover", "f1", ""),
    ("switchover_daemon_killed", "f1", "verifying"),
    ("failover", "a", ""),
    ("restart_lost", "a", ""),
    ("failback", "f1", ""),
)


def test_a_seeded_walk_keeps_every_invariant_after_every_step(
    daemon_factory, milvus_source_rocksmq, etcd_service, kafka_mock, tmp_path
):
    seed = walk_seed(SEED)
    with suite_walk(
        seed,
        make_daemon=daemon_factory,
        rocksmq=milvus_source_rocksmq,
        etcd_endpoint=etcd_service.endpoint,
        kafka_bootstrap=kafka_mock.bootstrap,
        workdir=tmp_path,
    ) as walk:
        walk.setup(home="b")
        result = walk.run(STEPS, script=OPERATORS_SEQUENCE)
    assert [s.index for s in result.steps] == list(range(1, STEPS + 1)), result.steps
    outcomes = [s.outcome for s in result.steps]
    assert outcomes[0].startswith("done: f1 primary a"), outcomes
    assert outcomes[1].startswith("failed") and "rolled_back True" in outcomes[1], outcomes
    assert "complete True" in outcomes[2], outcomes
    assert outcomes[4].startswith("in_sync: f1 replicated b -> a"), outcomes
    assert len(result.checks) == 9, result.checks  # every invariant, after every step
    waited = result.checks["stale_check_ends"] == STEPS + 2
    exported = re.search(r"(\d+) exported insert", outcomes[2])
    if exported and int(exported[1]):  # the export's keys were compared with the target's
        assert result.export_keys_compared > 0, (outcomes[2], result.export_keys_compared)
    # the stale-write checks' two once more when the walk's end waited for a check running
    assert all(
        result.checks[name] == STEPS + 1 + (name.startswith("stale_check") and waited)
        for name in result.checks
    ), result.checks
    tally = result.stale_checks  # every check asked ended (or a later switchover replaced it)
    assert tally.asked >= 1, tally
    assert sum(tally.ended.values()) + tally.superseded == tally.asked, tally
