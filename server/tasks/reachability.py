"""Can this daemon reach what its running tasks read and write? Probed every few seconds (a job
of server/runtime/jobs.py): the source's queue and etcd (the daemon's ``sourceConfig``) and each
running task's target, each distinct endpoint once per round, in parallel, with a timeout.

An endpoint that does not answer puts a warning on every running task that uses it, in its
``reason`` and ``progress.warnings`` (``source queue kafka://10.0.0.5:9092 unreachable since
2026-11-27T01:02:03Z, retrying``), taken away once it answers again; ``cdc_endpoint_up`` shows
each probed endpoint. An endpoint that answers and turns the daemon away says why after
``retrying`` (``...retrying: sasl_ssl://10.0.0.5:9092/bootstrap: SASL authentication error:
Authentication failed: ...``). The tasks themselves go on retrying as before: the probe only
says why nothing moves (a Kafka or Pulsar consumer whose broker is gone reads nothing and raises
nothing).

What a probe asks, per kind (never a secret in a label or a log line):

- Kafka (source or target): the brokers' metadata (``list_topics``);
- Pulsar: a TCP connection to each broker of the service URL (pulsar-client has no call bounded
  by less than its operation timeout);
- RocksMQ: the WAL's directory exists and can be read (it is local to the source Milvus);
- etcd: the cluster's status;
- Milvus target: its server version, on a connection of its own.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc
from etcd3.exceptions import Etcd3Exception

from replicator.config.connections import SourceSettings
from replicator.config.stores import etcd_client_for, explain_etcd
from replicator.config.task_spec import TaskSpec
from replicator.pipeline.status import unreachable_warning
from server.tasks.target_check import (
    TargetRefusedError,
    check_target_reachable,
    describe_target,
)

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 2.0

Probe = Callable[[float], None]  # raises when the endpoint does not answer within the timeout


@dataclass(frozen=True)
class Endpoint:
    role: str  # "source queue" | "source etcd" | "target"
    label: str  # how it is named to operators: a URL without credentials
    probe: Probe

    @property
    def key(self) -> tuple[str, str]:
        return self.role, self.label


class RefusedError(Exception):
    """The endpoint answers and turns the daemon away: credentials or certificates."""


@dataclass(frozen=True)
class Outage:
    since: float  # when a probe first failed (Unix time)
    error: str
    refusal: str = ""  # why the endpoint turns the daemon away, when it does

    def warning(self, endpoint: Endpoint) -> str:
        return unreachable_warning(endpoint.role, endpoint.label, self.since, self.refusal)


def _kafka_probe(config: Mapping[str, Any]) -> Probe:
    def probe(timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        from replicator.sources.kafka import BrokerRefusals

        refusals = BrokerRefusals()
        settings: dict[str, Any] = {
            **config,
            "socket.timeout.ms": int(timeout * 1000),
            "logger": refusals,  # librdkafka's lines, rate-limited; a refusal it only logs
            "error_cb": refusals,
        }
        admin = AdminClient(settings)
        try:
            admin.list_topics(timeout=timeout)
        except Exception:
            admin.poll(0)  # serves error_cb
            if refusals.last:
                raise RefusedError(refusals.last) from None
            raise

    return probe


def _tcp_probe(url: str) -> Probe:
    """Every host:port of a service URL (``pulsar://a:6650,b:6650``) accepts a connection."""

    def probe(timeout: float) -> None:
        netloc = urlsplit(url).netloc.rpartition("@")[2]
        for hostport in netloc.split(","):
            host, _, port = hostport.rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass

    return probe


def _path_probe(path: str) -> Probe:
    def probe(_timeout: float) -> None:
        if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
            raise FileNotFoundError(f"{path} is not a readable directory")

    return probe


def _etcd_probe(source: SourceSettings) -> Probe:
    def probe(timeout: float) -> None:
        try:
            client = etcd_client_for(source.etcd, timeout=timeout)
            try:
                client.status()
            finally:
                client.close()
        except (Etcd3Exception, grpc.RpcError) as exc:
            failure = explain_etcd(source.etcd, exc)
            if failure.refused:  # certificates or credentials: say why
                raise RefusedError(failure.reason) from None
            raise

    return probe


def source_endpoints(source: SourceSettings) -> list[Endpoint]:
    """The daemon's source queue and etcd."""
    kind = source.mq_type
    if kind == "kafka":
        queue = Endpoint(
            "source queue",
            f"kafka://{source.kafka.address}",
            _kafka_probe(source.kafka.client_config()),
        )
    elif kind == "rocksmq":
        queue = Endpoint(
            "source queue", f"rocksmq://{source.rocksmq.path}", _path_probe(source.rocksmq.path)
        )
    else:
        address = source.pulsar.address
        queue = Endpoint("source queue", _no_credentials(address), _tcp_probe(address))
    scheme = "https" if source.etcd.enableTLS else "http"
    etcd = Endpoint(
        "source etcd",
        ",".join(f"{scheme}://{a}" if "://" not in a else a for a in source.etcd.address),
        _etcd_probe(source),
    )
    return [queue, etcd]


def target_endpoint(spec: TaskSpec) -> Endpoint:
    """A task's target: a Milvus or the brokers of a Kafka target."""
    if spec.is_kafka:
        from replicator.sinks.kafka_positions import client_config

        kafka = spec.target_param
        config = client_config(kafka)
        return Endpoint("target", f"kafka://{kafka['address']}", _kafka_probe(config))
    connect = spec.target_param

    def probe(timeout: float) -> None:
        try:
            check_target_reachable({**connect, "connect_timeout": timeout})
        except TargetRefusedError as exc:  # an expired certificate, a new CA, a new password
            raise RefusedError(exc.refusal) from None

    return Endpoint("target", _no_credentials(describe_target(connect)), probe)


def _no_credentials(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


class _ProbeRun:
    """One probe in a daemon thread of its own: a probe stuck past its timeout (a client that
    ignores it) holds up neither the next round nor the daemon's exit."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.error = ""
        self.refusal = ""
        self.done = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(endpoint, timeout), name="reachability", daemon=True
        )
        thread.start()

    def _run(self, endpoint: Endpoint, timeout: float) -> None:
        try:
            endpoint.probe(timeout)
        except Exception as exc:  # noqa: BLE001 - any failure means "does not answer"
            self.error = _short(exc)
            self.refusal = str(exc) if isinstance(exc, RefusedError) else ""
        finally:
            self.done.set()


class ReachabilityWatch:
    """The last round's outages, by endpoint, and the endpoints probed in it."""

    def __init__(self, timeout: float = PROBE_TIMEOUT) -> None:
        self.timeout = timeout
        self.outages: dict[tuple[str, str], Outage] = {}
        self.probed: dict[tuple[str, str], bool] = {}  # endpoint -> answered
        self._running: dict[tuple[str, str], _ProbeRun] = {}  # probes not finished yet

    def check(self, endpoints: Iterable[Endpoint]) -> dict[tuple[str, str], Outage]:
        """Probe each distinct endpoint once, in parallel (blocking, at most about the
        timeout); the outages now. An endpoint whose last probe has not ended is not probed
        again: it counts as not answering."""
        distinct = {endpoint.key: endpoint for endpoint in endpoints}
        runs = {
            key: self._running.get(key) or _ProbeRun(endpoint, self.timeout)
            for key, endpoint in distinct.items()
        }
        deadline = time.monotonic() + self.timeout + 1.0
        for run in runs.values():
            run.done.wait(max(0.0, deadline - time.monotonic()))
        self._running = {key: run for key, run in runs.items() if not run.done.is_set()}
        now = time.time()
        outages: dict[tuple[str, str], Outage] = {}
        for key, run in runs.items():
            endpoint = distinct[key]
            error = run.error if run.done.is_set() else f"no answer within {self.timeout:.0f} s"
            before = self.outages.get(key)
            if not error:
                if before is not None:
                    log.info("%s %s answers again", endpoint.role, endpoint.label)
                continue
            refusal = run.refusal if run.done.is_set() else ""
            outages[key] = Outage(before.since if before else now, error, refusal)
            if before is None:
                log.warning("%s %s unreachable: %s", endpoint.role, endpoint.label, error)
        self.outages = outages
        self.probed = {key: key not in outages for key in distinct}
        return outages


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."
