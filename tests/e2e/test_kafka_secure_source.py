"""A Kafka source behind TLS and SASL: replicated through the daemon, and every refusal named.

The broker is librdkafka's mock cluster behind our TLS/SASL proxy (tests/harness/
kafka_secure_proxy.py): no Apache Kafka runs here. The daemon's side (and the test writer's) is
librdkafka's real TLS and SASL code; the broker's side of TLS is Python's ``ssl``, of SASL ours.
The stream is a Milvus 2.6 one, written as tests/e2e/test_streaming_source.py writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.kafka_secure_proxy import (
    AUTH_FAILED_MESSAGE,
    ProxyConfig,
    SecureKafka,
    kafka_secure_cluster,
)
from harness.services import wait_until
from harness.streaming_writer import StreamingWriter
from harness.tls import Pki, make_test_pki

from replicator.config.connections import KafkaSettings, SourceSettings
from replicator.sources.kafka import KafkaSource
from server.tasks.reachability import ReachabilityWatch, source_endpoints
from tests.e2e.test_streaming_source import Stream, start_task, wait_rows

pytestmark = pytest.mark.e2e

PASSWORD = "Kafka-Sasl-Pa55-never-shown"
USERS = {"cdc": PASSWORD}
_CERT_FAILED = (
    "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker "
    "certificate could not be verified, verify that ssl.ca.location is correctly configured or "
    "root CA certificates are installed (install ca-certificates package)"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("kafka-pki"))


def _proxy(pki: Pki, case: str) -> ProxyConfig:
    server = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    return {
        "ssl": ProxyConfig(**server),
        "mtls+sasl_ssl": ProxyConfig(**server, client_ca_file=str(pki.ca_file), users=USERS),
        "sasl_plaintext": ProxyConfig(users=USERS),
        "sasl_ssl at a plaintext listener": ProxyConfig(users=USERS),
        "wrong password": ProxyConfig(users=USERS),
        "wrong CA": ProxyConfig(**server),
        "wrong host": ProxyConfig(
            cert_file=str(pki.wrong_host_cert), key_file=str(pki.wrong_host_key)
        ),
        "expired": ProxyConfig(cert_file=str(pki.expired_cert), key_file=str(pki.expired_key)),
    }[case]


def _kafka(pki: Pki, case: str) -> dict[str, object]:
    """``sourceConfig.kafka`` as an operator copies it from milvus.yaml (address added later)."""
    tls = {"enabled": True, "tlsCaCert": str(pki.ca_file)}
    sasl = {"saslUsername": "cdc", "saslPassword": PASSWORD}
    return {
        "ssl": {"ssl": tls},
        "mtls+sasl_ssl": {
            **sasl,
            "saslMechanisms": "SCRAM-SHA-512",
            "securityProtocol": "SASL_SSL",
            "ssl": {**tls, "tlsCert": str(pki.client_cert), "tlsKey": str(pki.client_key)},
        },
        "sasl_plaintext": {**sasl, "saslMechanisms": "PLAIN", "securityProtocol": "SASL_PLAINTEXT"},
        "sasl_ssl at a plaintext listener": {
            **sasl,
            "saslMechanisms": "PLAIN",
            "securityProtocol": "SASL_SSL",
            "ssl": tls,
        },
        "wrong password": {**sasl, "saslPassword": "not-it", "saslMechanisms": "SCRAM-SHA-256"},
        "wrong CA": {"ssl": {**tls, "tlsCaCert": str(pki.other_ca_file)}},
        "wrong host": {"ssl": tls},
        "expired": {"ssl": tls},
    }[case]


@pytest.fixture
def secure(
    request: pytest.FixtureRequest, pki: Pki, tmp_path: Path
) -> Iterator[tuple[SecureKafka, dict]]:
    case = request.param
    with kafka_secure_cluster(tmp_path / "kafka", _proxy(pki, case)) as cluster:
        yield cluster, {"address": cluster.bootstrap, **_kafka(pki, case)}


def _source(etcd_service, prefix: str, kafka: dict, channels: int) -> dict:
    return {
        "sourceConfig": {
            "etcd": {"address": [etcd_service.endpoint]},
            "etcdRootPath": f"{prefix}-meta",
            "channelPrefix": prefix,
            "kafka": kafka,
            "dmlChannelNum": channels,
        }
    }


@contextlib.contextmanager
def _replicating(
    daemon_factory, etcd_service, milvus_lite_service, secure, **daemon: object
) -> Iterator[tuple[Stream, object, str, str]]:
    """The stream, a started daemon reading it through the proxy, its task's id and collection."""
    cluster, kafka = secure
    client = KafkaSettings.model_validate(kafka).client_security()
    writer = StreamingWriter(cluster.bootstrap, client=client)
    stream = Stream(writer, f"sec{uuid.uuid4().hex[:6]}", channels=2)
    try:
        stream.tick_all()
        config = {**_source(etcd_service, stream.prefix, kafka, 2), **daemon}
        started = daemon_factory(**config).start()
        name = f"secure_{uuid.uuid4().hex[:6]}"
        task_id = start_task(started, milvus_lite_service.uri, stream, name)
        yield stream, started, task_id, name
    finally:
        writer.close()


_COLLECTION = 61001


def _write_rows(stream: Stream, name: str, keys: range, *, create: bool = False) -> None:
    v0, v1 = stream.vchannels(_COLLECTION, 2)
    if create:
        stream.writer.create_collection(_COLLECTION, name, [v0, v1, f"{stream.pchannel(0)}_vcchan"])
    half = keys.start + len(keys) // 2
    stream.writer.insert(v0, _COLLECTION, range(keys.start, half))
    stream.writer.insert(v1, _COLLECTION, range(half, keys.stop))
    stream.tick_all()


@pytest.mark.parametrize("secure", ["ssl", "mtls+sasl_ssl", "sasl_plaintext"], indirect=True)
def test_a_source_behind_tls_or_sasl_replicates(
    daemon_factory, etcd_service, milvus_lite_service, target_client, secure
):
    """One-way TLS; mutual TLS with SASL_SSL SCRAM-SHA-512; SASL_PLAINTEXT PLAIN. The password
    shows in no answer, no log line and not in ``milvus-cdc config show``."""
    _cluster, kafka = secure
    with _replicating(daemon_factory, etcd_service, milvus_lite_service, secure) as running:
        stream, daemon, task_id, name = running
        _write_rows(stream, name, range(100), create=True)
        wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(100)}, daemon=daemon)

    answers = [daemon.call(kind, {"task_id": task_id}).body for kind in ("get", "position")]
    answers.append(daemon.call("list").body)
    answers += [str(daemon.get(path)) for path in ("/metrics", "/v1/tasks")]
    command = [str(Path(sys.executable).parent / "milvus-cdc"), "config", "show"]
    shown = subprocess.run(
        [*command, "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
    ).stdout
    assert '"saslPassword": "******"' in shown or "saslPassword" not in kafka
    for text in [*map(str, answers), shown, daemon.log_text()]:
        assert PASSWORD not in text


@pytest.mark.parametrize("secure", ["sasl_plaintext"], indirect=True)
def test_a_running_task_refused_its_login_says_why_retries_and_catches_up(
    daemon_factory, etcd_service, milvus_lite_service, target_client, secure
):
    cluster, _kafka = secure
    with _replicating(
        daemon_factory,
        etcd_service,
        milvus_lite_service,
        secure,
        scheduler={"reachabilitySeconds": 0.5},
    ) as running:
        stream, daemon, task_id, name = running
        _write_rows(stream, name, range(50), create=True)
        wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(50)}, daemon=daemon)

        def task() -> dict:
            return daemon.call("get", {"task_id": task_id}).data["task"]

        refusal = f", retrying: {_refused(cluster.bootstrap, 'wrong password')}"

        def told() -> str | None:
            view = task()
            assert view["state"] == "Running", view
            warnings = (view.get("progress") or {}).get("warnings") or []
            said = [w for w in warnings if w.endswith(refusal) and w in view["reason"]]
            return said[0] if said else None

        os.kill(cluster.pid, signal.SIGUSR1)  # the broker turns the daemon's user away
        warning = wait_until(told, 30, "the refusal in the task's reason and warnings")
        assert warning.startswith(f"source queue kafka://{cluster.bootstrap} unreachable since ")
        os.kill(cluster.pid, signal.SIGUSR2)
        wait_until(lambda: not told(), 30, "the refusal withdrawn")
        _write_rows(stream, name, range(50, 100))
        wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(100)}, daemon=daemon)
        assert task()["state"] == "Running"


def _refused(bootstrap: str, case: str) -> str:
    if case == "wrong password":
        return (
            f"sasl_plaintext://{bootstrap}/bootstrap: SASL authentication error: "
            f"{AUTH_FAILED_MESSAGE}"
        )
    if case == "sasl_ssl at a plaintext listener":  # librdkafka says it only in its log
        return (
            f"sasl_ssl://{bootstrap}/bootstrap: SSL handshake failed: Disconnected: SSL "
            "connection closed by peer: connecting to a PLAINTEXT broker listener?"
        )
    return f"ssl://{bootstrap}/bootstrap: {_CERT_FAILED}"


@pytest.mark.parametrize(
    "secure",
    ["wrong password", "wrong CA", "wrong host", "expired", "sasl_ssl at a plaintext listener"],
    indirect=True,
)
def test_a_refused_source_fails_the_create_naming_the_endpoint_and_why(
    daemon_factory, etcd_service, milvus_lite_service, secure, request
):
    cluster, kafka = secure
    case = request.node.callspec.params["secure"]
    prefix = f"bad{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**_source(etcd_service, prefix, kafka, 1)).start()
    target = {"uri": milvus_lite_service.uri, "connect_timeout": 3}
    created = daemon.call(
        "create", {"milvus_connect_param": target, "collection_infos": [{"name": "*"}]}
    )
    assert created.code == 503, created.body
    message = re.sub(r"^task \S+: ", "task T: ", created.message)
    assert message == (
        f"task T: the source (source queue kafka://{cluster.bootstrap}, source etcd "
        f"{etcd_service.endpoint}) could not be read to fix where the task starts, so it was "
        f"not created: SourceUnavailableError: kafka: {_refused(cluster.bootstrap, case)}"
    )
    assert daemon.call("list").data["tasks"] == []  # nothing stored
    # librdkafka's own lines ("%3|1700000000.123|FAIL|rdkafka#consumer-1| ...", about 20 a
    # second) go through the JSON log, each distinct one once
    lines = daemon.log_text().splitlines()
    assert not [line for line in lines if re.match(r"%\d\|", line)], lines[:5]
    said = [json.loads(line) for line in lines if line.startswith("{")]
    fails = [r for r in said if r.get("logger") == "librdkafka"]
    assert fails and len(fails) <= 4 * len({r["msg"] for r in fails}), fails

    # a running task's warning: what the reachability job puts in its reason
    watch = ReachabilityWatch(timeout=3)
    source = SourceSettings.model_validate(_source(etcd_service, prefix, kafka, 1)["sourceConfig"])
    queue = source_endpoints(source)[0]
    outage = watch.check([queue])[queue.key]
    told = re.escape(f"source queue kafka://{cluster.bootstrap} unreachable since ")
    told += r"\S+" + re.escape(f", retrying: {_refused(cluster.bootstrap, case)}")
    assert re.fullmatch(told, outage.warning(queue)), outage.warning(queue)

    if case == "wrong host":  # the opt-out: the chain is still checked, the name no longer
        lax = {**kafka, "ssl": {**kafka["ssl"], "verifyHostname": False}}
        security = KafkaSettings.model_validate(lax).client_security()
        assert KafkaSource(cluster.bootstrap, security).watermarks("any", timeout=5) == (0, 0)
