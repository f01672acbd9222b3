"""What the librdkafka mock shows a ``read_committed`` consumer (issue 48: the Kafka kill test's
unexplained "1 missing"). A producer begins a transaction, produces to two partitions, is acked,
and is killed with SIGKILL before its EndTxn; then the next producer of its
``transactional.id`` starts (a real broker aborts the open transaction then), and another
transaction is aborted outright.

Measured: the mock shows every one of those records to a ``read_committed`` consumer, as if
committed: it has transactions but no read isolation. So on the mock a ``kill -9`` between a
commit's position record being acked and its EndTxn leaves that position visible, and a
transaction whose events were not all acked yet (librdkafka delivers partitions independently)
looks committed with fewer events than its position record names; the daemon, reading the mock,
then resumes after it. A real broker hides the whole transaction. The kill test
(tests/e2e/test_kafka_sink.py) therefore accounts per transaction. If this test fails, the mock
gained isolation and that accounting can become strict."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Producer

from tests.integration.test_kafka_target import events

pytestmark = pytest.mark.integration

KILLED_PRODUCER = r"""
import os, signal, sys
from confluent_kafka import Producer
bootstrap, topic, transactional_id = sys.argv[1:4]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
producer.init_transactions(30)
producer.begin_transaction()
for partition in (0, 1):
    producer.produce(topic, b'"killed-%d"' % partition, partition=partition)
if producer.flush(30) != 0:
    sys.exit(3)  # not acked: the test would prove nothing
print("acked", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_mock_shows_killed_and_aborted_transactions_to_read_committed(kafka_mock) -> None:
    bootstrap, topic = kafka_mock.bootstrap, f"isolation-{uuid.uuid4().hex[:8]}"
    committed = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"c-{topic}"})
    committed.init_transactions(30)
    committed.begin_transaction()
    committed.produce(topic, b'"committed"', partition=2)
    committed.commit_transaction(30)

    transactional_id = f"k-{topic}"
    run = subprocess.run(
        [sys.executable, "-c", KILLED_PRODUCER, bootstrap, topic, transactional_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -9 and "acked" in run.stdout, (run.returncode, run.stderr[-2000:])
    # (events() reads every partition to its end with isolation.level=read_committed)
    killed = ["killed-0", "killed-1"]
    assert sorted(events(bootstrap, topic)) == sorted([*killed, "committed"])

    # the next producer of that transactional.id: a real broker aborts the open transaction
    successor = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic, b'"aborted"', partition=3)
    successor.flush(30)
    successor.abort_transaction(30)
    assert sorted(events(bootstrap, topic)) == sorted([*killed, "committed", "aborted"])
