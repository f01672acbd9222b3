"""Verify and repair end to end: a real Milvus 2.3.5 source (WAL on the Kafka mock) replicated by
the daemon into a real Milvus 2.3.5 target. Rows deleted, altered and added directly on the
target are reported exactly (counts and keys) and a repair makes the target equal again; a
verify under a steady write load reports no divergence; varchar keys with quotes, backslashes,
spaces and unicode are compared, reported and repaired."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from harness.daemon import REPO_ROOT, Daemon
from harness.services import wait_until
from pymilvus import MilvusClient
from test_backfill import Writer, create_varchar_collection, int_rows, task_view, vector
from test_replication import create_source_collection, create_task, source_config, wait_equal

from replicator.backfill.ranges import literal

pytestmark = pytest.mark.e2e

RANGE_ROWS = 500
# verifies in a row under writes: 3 in CI (the suite's time); the ten runs in a row with
# CDC_TEST_VERIFY_RUNS=10 (run so on the verify branch: 10 verifies, 0 divergence)
UNDER_WRITES_RUNS = int(os.environ.get("CDC_TEST_VERIFY_RUNS", "3"))


def verify_config(milvus_source, etcd_service, kafka_mock) -> dict:
    config = source_config(milvus_source, etcd_service, kafka_mock)
    config["sourceConfig"]["milvus"] = {"uri": milvus_source.uri}
    config["verify"] = {"rangeRows": RANGE_ROWS, "batchRows": 400, "settleSeconds": 60}
    return config


def wait_verify(daemon: Daemon, task_id: str, job_id: str, timeout: float = 300) -> dict:
    def finished() -> dict | None:
        verify = task_view(daemon, task_id)["verify"]
        if verify and verify["job_id"] == job_id and verify["state"] in ("done", "failed"):
            return verify
        return None

    verify = wait_until(finished, timeout, "the verify to finish", interval=0.5)
    assert verify["state"] == "done", f"{verify.get('reason')}: {verify}"
    return verify


def run_verify(daemon: Daemon, task_id: str, **body: object) -> dict:
    status, _, answer = daemon.request("POST", f"/v1/tasks/{task_id}/verify", body or None)
    assert status == 202, answer
    return wait_verify(daemon, task_id, answer["job_id"])


def only_collection(verify: dict) -> dict:
    (collection,) = verify["collections"]
    return collection


def kinds(collection: dict) -> dict:
    return {
        k: (collection[k]["count"], collection[k]["keys"])
        for k in ("missing", "extra", "different")
    }


def cli(daemon: Daemon, *args: str, timeout: float = 300) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "server", "task", *args, *daemon.cli_args],
        capture_output=True,
        text=True,
        env=env,
        cwd=daemon.workdir,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def sides(milvus_source, milvus_source_rocksmq) -> Iterator[tuple[MilvusClient, MilvusClient]]:
    """Clients of the source and of the target."""
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    yield source, target
    source.close()
    target.close()


@pytest.fixture
def replicate(daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq):
    """Start a daemon that can verify (``verify`` settings over verify_config's) and a task
    replicating the named collections: (daemon, task id)."""

    def start(*names: str, **verify: object) -> tuple[Daemon, str]:
        config = verify_config(milvus_source, etcd_service, kafka_mock)
        config["verify"].update(verify)
        daemon = daemon_factory(**config).start()
        return daemon, create_task(daemon, milvus_source_rocksmq.uri, *names)

    return start


def test_divergence_made_on_the_target_is_reported_exactly_and_repaired(sides, replicate):
    source, target = sides
    name = f"vf_{uuid.uuid4().hex[:8]}"
    create_source_collection(source, name, dynamic=False)
    # the 4 ranges made to differ below (0, 1, 3, 5) are compared again at once, not 2 and then
    # 2 more (each waits for the task to apply its read, and a repair's too: seconds each)
    daemon, task_id = replicate(name, parallelism=4)
    for start in range(0, 3000, 1000):
        source.insert(name, int_rows(range(start, start + 1000), "row", start))
    wait_equal(source, target, name, "id", timeout=120)

    # divergence made behind the task's back, on the target only
    target.delete(name, ids=[5, 777, 2999])
    target.upsert(name, [dict(r, title="altered") for r in int_rows([10, 1500], "row")])
    target.insert(name, int_rows([100_000, 100_001], "extra"))

    # over POST /cdc: 200 with the job id
    asked = daemon.call("verify", {"task_id": task_id, "collections": ["*"], "repair": False})
    assert asked.code == 200, asked.body
    verify = wait_verify(daemon, task_id, asked.data["job_id"])
    collection = only_collection(verify)
    assert collection["collection"] == f"default.{name}"
    assert kinds(collection) == {
        "missing": (3, [5, 777, 2999]),
        "extra": (2, [100_000, 100_001]),
        "different": (2, [10, 1500]),
    }, verify
    assert verify["divergent_rows"] == 7 and verify["repaired"] is None, verify
    assert verify["ranges_done"] == verify["ranges_total"] == 3000 // RANGE_ROWS, verify
    assert verify["rows_compared"] >= 3000, verify
    assert collection["unsettled"] == [], collection

    # the same under get (POST /cdc) and /metrics
    got = daemon.call("get", {"task_id": task_id}).data["task"]
    assert got["progress"]["verify"]["job_id"] == asked.data["job_id"]
    metrics = daemon.get("/metrics")[1].decode()
    labels = f'collection="default.{name}",kind="missing",task_id="{task_id}"'
    assert f"cdc_verify_divergent_rows{{{labels}}} 3.0" in metrics, metrics
    assert f'cdc_verify_last_time_seconds{{state="done",task_id="{task_id}"}}' in metrics

    # bad input: 400 naming the problem; an unknown task: 404
    status, _, problem = daemon.request("POST", f"/v1/tasks/{task_id}/verify", {"repair": "yes"})
    assert status == 400 and "repair" in problem["detail"], problem
    status, _, problem = daemon.request("POST", f"/v1/tasks/{task_id}/verify", {"collections": []})
    assert status == 400 and "collections" in problem["detail"], problem
    refused = daemon.call("verify", {"task_id": task_id, "collections": ["not_selected"]})
    assert refused.code == 400 and "not selected by the task" in refused.message, refused.body
    status, _, problem = daemon.request("POST", "/v1/tasks/nosuchtask/verify")
    assert status == 404, problem

    # repair with the CLI, following it to the end
    code, output = cli(daemon, "verify", task_id, "--repair", "--follow")
    assert code == 0, output
    assert "3 missing, 2 extra, 2 different" in output, output
    assert "7 repaired" in output, output
    wait_equal(source, target, name, "id", timeout=60)

    # a verify after the repair finds nothing; the result is shown after a restart
    clean = run_verify(daemon, task_id)
    assert clean["divergent_rows"] == 0 and clean["rows_compared"] == 3000, clean
    daemon.stop()
    daemon.start()
    after_restart = task_view(daemon, task_id)["verify"]
    assert after_restart["job_id"] == clean["job_id"], after_restart
    assert after_restart["state"] == "done", after_restart


def test_a_verify_under_steady_writes_reports_no_divergence(sides, replicate, milvus_source):
    source, target = sides
    name = f"vw_{uuid.uuid4().hex[:8]}"
    create_source_collection(source, name, dynamic=False)
    # the ranges are compared 4 at a time: under writes each run settles its unsettled keys in
    # a few rounds instead of one range after another
    daemon, task_id = replicate(name, parallelism=4)
    source.insert(name, int_rows(range(2000), "old"))
    wait_equal(source, target, name, "id", timeout=120)

    new_ids = iter(range(1_000_000, 2_000_000))

    def write(client: MilvusClient, rnd: random.Random, n: int) -> None:
        client.insert(name, int_rows([next(new_ids) for _ in range(10)], f"new{n}", n))
        touched = rnd.sample(range(2000), 15)
        client.upsert(name, int_rows(touched[:10], f"upserted{n}", n))
        client.delete(name, ids=touched[10:])

    writer = Writer(milvus_source.uri, write)
    writer.start()
    results = []
    try:
        for _ in range(UNDER_WRITES_RUNS):
            verify = run_verify(daemon, task_id)
            results.append(verify)
            assert verify["divergent_rows"] == 0, kinds(only_collection(verify))
            assert verify["ranges_done"] == verify["ranges_total"] >= 4, verify
    finally:
        writer.finish()
    unsettled = [u for v in results for u in only_collection(v)["unsettled"]]
    print(
        f"verify under writes: {len(results)} runs, {writer.rounds} write rounds, "
        f"rows compared {[v['rows_compared'] for v in results]}, unsettled {unsettled}"
    )
    wait_equal(source, target, name, "id", timeout=120)


AWKWARD = ['say "hi"', "back\\slash", "two  spaces", " lead", "ünïcødé 键 🙂", "it's", 'q"\\mix']


def awkward_rows(keys: list[str], note: str, seed: int = 0) -> list[dict]:
    rnd = random.Random(seed)
    return [{"key": key, "vec": vector(rnd), "note": f"{note}-{key}"} for key in keys]


def test_varchar_keys_with_quotes_spaces_and_unicode(sides, replicate):
    source, target = sides
    name = f"vv_{uuid.uuid4().hex[:8]}"
    create_varchar_collection(source, name)
    daemon, task_id = replicate(name)
    plain = [f"k{n:05d}" for n in range(1200)]
    source.insert(name, awkward_rows(plain + AWKWARD, "src"))
    wait_equal(source, target, name, "key", timeout=120, by_key=True)

    gone, altered, extra = AWKWARD[0], AWKWARD[4], "extra \"'\\ ключ"
    target.delete(name, filter=f"key in [{literal(gone)}, {literal(AWKWARD[1])}]")
    target.upsert(name, [dict(awkward_rows([altered], "changed")[0], dynamic=1)])
    target.insert(name, awkward_rows([extra], "extra"))

    verify = run_verify(daemon, task_id, collections=[name])
    assert kinds(only_collection(verify)) == {
        "missing": (2, sorted([gone, AWKWARD[1]])),
        "extra": (1, [extra]),
        "different": (1, [altered]),
    }, verify

    repaired = run_verify(daemon, task_id, collections=[name], repair=True)
    assert repaired["repaired"] == 4, repaired
    wait_equal(source, target, name, "key", timeout=60, by_key=True)
    assert run_verify(daemon, task_id)["divergent_rows"] == 0


def test_a_task_asks_for_a_scheduled_sampled_verify(
    sides, daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """``verify.intervalHours`` at create (about 2 s here) and the scheduler checking every
    second: verifies start by themselves, each over half of the ranges."""
    source, target = sides
    name = f"vs_{uuid.uuid4().hex[:8]}"
    create_source_collection(source, name, dynamic=False)
    config = verify_config(milvus_source, etcd_service, kafka_mock)
    config["verify"]["scheduleCheckSeconds"] = 1
    daemon = daemon_factory(**config).start()
    created = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": milvus_source_rocksmq.uri},
            "collection_infos": [{"name": name}],
            "verify": {"intervalHours": 2 / 3600, "sampleFraction": 0.5},
        },
    )
    assert created.code == 200, created.body
    task_id = created.data["task_id"]
    source.insert(name, int_rows(range(3000), "row"))
    wait_equal(source, target, name, "id", timeout=120)

    seen: set[str] = set()

    def two_scheduled_runs_done() -> dict | None:
        verify = task_view(daemon, task_id)["verify"]
        # (counted once the rows arrived: 6 ranges, half of them compared)
        if (
            verify
            and verify["scheduled"]
            and verify["state"] == "done"
            and (verify["ranges_total"] == 3000 // RANGE_ROWS // 2)
        ):
            seen.add(verify["job_id"])
        return verify if len(seen) >= 2 else None

    verify = wait_until(two_scheduled_runs_done, 120, "two scheduled verifies", interval=0.3)
    assert verify["sample"] == 0.5 and verify["repair"] is False, verify
    assert verify["divergent_rows"] == 0 and verify["ranges_done"] == 3, verify
    got = daemon.call("get", {"task_id": task_id}).data["task"]
    assert got["verify"] == {"intervalHours": 2 / 3600, "sampleFraction": 0.5}, got


def test_a_milvus_lite_target(
    source_client, daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_lite_service
):
    """The same report against Milvus Lite as the target."""
    name = f"vl_{uuid.uuid4().hex[:8]}"
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    try:
        create_source_collection(source_client, name, dynamic=False)
        daemon = daemon_factory(**verify_config(milvus_source, etcd_service, kafka_mock)).start()
        task_id = create_task(daemon, milvus_lite_service.uri, name)
        source_client.insert(name, int_rows(range(1200), "row"))
        wait_equal(source_client, target, name, "id", timeout=120)
        target.delete(name, ids=[3])
        target.upsert(name, [dict(r, title="altered") for r in int_rows([700], "row")])
        target.insert(name, int_rows([5000], "extra"))
        verify = run_verify(daemon, task_id)
        assert kinds(only_collection(verify)) == {
            "missing": (1, [3]),
            "extra": (1, [5000]),
            "different": (1, [700]),
        }, verify
        assert run_verify(daemon, task_id, repair=True)["repaired"] == 3
        wait_equal(source_client, target, name, "id", timeout=60)
    finally:
        target.close()


@pytest.mark.timeout(900)  # two Spark sessions (each 5-40 s to start, more when loaded)
def test_a_large_enough_collection_is_digested_on_spark_and_its_divergence_reported_exactly(
    sides, daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """With verify.sparkMinRows under the collection's rows, its range digests are one Spark job
    (local[2]); the ranges whose digests differ are compared by the daemon, which reports the
    divergence exactly, as for a collection verified in the daemon."""
    source, target = sides
    name = f"vs_{uuid.uuid4().hex[:8]}"
    create_source_collection(source, name, dynamic=True)
    config = verify_config(milvus_source, etcd_service, kafka_mock)
    config["verify"]["sparkMinRows"] = 2000
    # the 3 ranges whose digests differ (0, 3 and 5 below) are compared again at once, not 2 then
    # the third after them (each waits for the task to apply its read: several seconds)
    config["verify"]["parallelism"] = 3
    config["backfill"] = {"sparkMaster": "local[2]", "taskMaxFailures": 2}
    daemon = daemon_factory(**config).start()
    task_id = create_task(daemon, milvus_source_rocksmq.uri, name)
    for start in range(0, 3000, 1000):
        rows = int_rows(range(start, start + 1000), "row", start)
        # a dynamic key on every other row: the column digest merges them as pymilvus would
        source.insert(name, [dict(r, color=f"c{r['id']}") if r["id"] % 2 else r for r in rows])
    wait_equal(source, target, name, "id", timeout=120)

    target.delete(name, ids=[5, 2999])
    target.upsert(name, [dict(r, title="altered") for r in int_rows([1500], "row")])
    target.insert(name, int_rows([100_000], "extra"))

    verify = run_verify(daemon, task_id)
    collection = only_collection(verify)
    assert kinds(collection) == {
        "missing": (2, [5, 2999]),
        "extra": (1, [100_000]),
        "different": (1, [1500]),
    }, verify
    assert verify["ranges_done"] == verify["ranges_total"] == 3000 // RANGE_ROWS, verify
    assert verify["rows_compared"] >= 3000, verify
    # ranges 0 (key 5), 3 (key 1500) and 5 (2999, and 100000: the last range is open) differ
    spark_notes = [n for n in verify["notes"] if "digested on Spark" in n]
    assert len(spark_notes) == 1, verify["notes"]
    assert "6 ranges digested on Spark (local[2" in spark_notes[0], spark_notes
    assert "3 compared again in the daemon" in spark_notes[0], spark_notes

    # the 3 ranges compared again are the ones that differ: the other 3 digests, rows with and
    # without dynamic keys, agreed between Spark and the target read by the daemon
    clean = run_verify(daemon, task_id, repair=True)
    assert clean["repaired"] == 4, clean
    assert any("3 compared again in the daemon" in n for n in clean["notes"]), clean["notes"]
    wait_equal(source, target, name, "id", timeout=60)

    # a Spark that fails (a master it cannot use): the daemon digests every range itself
    daemon.stop()
    daemon.config["backfill"] = {"sparkMaster": "no-such-master://x", "taskMaxFailures": 1}
    daemon.start()
    target.delete(name, ids=[7])
    fallback = run_verify(daemon, task_id)
    assert kinds(only_collection(fallback)) == {
        "missing": (1, [7]),
        "extra": (0, []),
        "different": (0, []),
    }, fallback
    assert fallback["ranges_done"] == fallback["ranges_total"], fallback
    failed = [n for n in fallback["notes"] if "failed, every range is digested in the daemon" in n]
    assert len(failed) == 1 and "no-such-master" in failed[0], fallback["notes"]
