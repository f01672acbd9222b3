"""The backfill of every field type a real Milvus 2.3.5 source holds (see test_field_types.py,
whose collections and comparison it uses): rows written before the task are copied by the
Spark backfill into a real Milvus 2.3.5 with every type intact, rows written after it stream
on. A file of its own: the files that run Spark jobs are one test group (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest
from field_type_shapes import create_collections, write_all
from pymilvus import MilvusClient
from test_backfill import backfill_config, wait_backfill
from test_field_types import shape_names, wait_same
from test_verify import kinds as verify_kinds
from test_verify import only_collection, run_verify

pytestmark = pytest.mark.e2e

# CDC_TEST_SPARK_VERIFY=1: the backfill test also verifies the every-type collection on Spark
# (verify.sparkMinRows 1; about 20 s more, so not in the suite's default run)
SPARK_VERIFY = os.environ.get("CDC_TEST_SPARK_VERIFY") == "1"


@pytest.mark.timeout(600)
def test_every_2_3_5_type_backfilled_exactly(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """Rows written before the task are copied by the backfill (Spark) with every type intact;
    rows written after it stream on."""
    names = shape_names()
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_collections(source, names)
        written = write_all(source, names)
        config = backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=40)
        if SPARK_VERIFY:
            config["verify"] = {"rangeRows": 40, "batchRows": 30, "sparkMinRows": 1}
        daemon = daemon_factory(**config).start()
        created = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": milvus_source_rocksmq.uri},
                "collection_infos": [{"name": n} for n in names.values()],
                "backfill": {"collections": ["*"]},
            },
        )
        assert created.code == 200, created.body
        backfill = wait_backfill(daemon, created.data["task_id"], timeout=400)
        assert backfill["ranges_done"] == backfill["ranges_total"] >= len(names), backfill
        copied = sum(len(written.alive(name)) for name in names.values())
        assert backfill["rows_done"] >= copied, backfill  # the copy wrote them, every one
        after = write_all(source, names, start=1000)  # streamed, after the copy
        for name in names.values():
            wait_same(source, target, name, written.keys[name] | after.keys[name])
        if SPARK_VERIFY:  # the verify's digests as a Spark job, every type read there
            verify = run_verify(daemon, created.data["task_id"], collections=[names["every"]])
            assert verify["divergent_rows"] == 0, verify_kinds(only_collection(verify))
            alive = written.alive(names["every"]) | after.alive(names["every"])
            assert verify["rows_compared"] >= len(alive), verify
    finally:
        source.close()
        target.close()
