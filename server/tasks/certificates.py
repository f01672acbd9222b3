"""The client certificates this daemon presents, and when each expires: shown before it does.

Every endpoint the daemon reaches with a client certificate of its own (mutual TLS): the etcd
metastore, each source cluster's etcd, Kafka or Pulsar and Milvus, each running task's target
Milvus, and the daemon's own serving certificate. The files are read at each look (a rotation
shows at once). A certificate expiring within ``scheduler.certificateWarningDays`` (or expired)
is a warning: on the tasks that use it (their ``reason`` and ``progress.warnings``), in
``/readyz`` (``certificates``), in ``milvus-cdc check``; the gauge
``cdc_certificate_expiry_seconds{role,endpoint,file}`` has the seconds left for every one
(negative once expired).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metastore.etcd_diagnosis import endpoint_urls
from metastore.tls_files import CertificateExpiry, certificate_expiry
from replicator.config.connections import EtcdSettings, SourceSettings
from replicator.config.settings import CdcSettings
from replicator.config.stores import etcd_tls_of
from replicator.config.task_spec import TaskSpec

DAY = 86400.0


@dataclass(frozen=True)
class ClientCertificate:
    role: str  # "metastore" | "source etcd" | "source queue" | "source milvus" | "target" | ...
    endpoint: str  # as operators know it: a URL without credentials
    path: str


def _etcd(role: str, etcd: EtcdSettings) -> list[ClientCertificate]:
    tls = etcd_tls_of(etcd)
    if tls is None or not tls.cert_path:
        return []
    return [ClientCertificate(role, ",".join(endpoint_urls(etcd.address, tls)), tls.cert_path)]


def source_certificates(source: SourceSettings) -> list[ClientCertificate]:
    """A source cluster's: its etcd, its queue (Kafka, Pulsar), its Milvus."""
    found = _etcd("source etcd", source.etcd)
    kind = source.mq_type
    if kind == "kafka" and source.kafka.ssl.tlsCert:
        found.append(
            ClientCertificate(
                "source queue", f"kafka://{source.kafka.address}", source.kafka.ssl.tlsCert
            )
        )
    if kind == "pulsar" and source.pulsar.tlsCertificateFilePath:
        address = source.pulsar.address.rpartition("@")[2]
        found.append(
            ClientCertificate("source queue", address, source.pulsar.tlsCertificateFilePath)
        )
    if source.milvus.client_pem_path:
        found.append(
            ClientCertificate("source milvus", source.milvus.uri, source.milvus.client_pem_path)
        )
    return found


def daemon_certificates(settings: CdcSettings) -> list[ClientCertificate]:
    """The daemon's own: its metastore's, each configured cluster's, its serving one."""
    found: list[ClientCertificate] = []
    if settings.metaStoreConfig.storeType == "etcd":
        found += _etcd("metastore", settings.metaStoreConfig.etcd)
    found += source_certificates(settings.sourceConfig)
    for source in settings.clusters.values():
        found += source_certificates(source)
    if settings.tls.certFile:
        found.append(ClientCertificate("serving", settings.address, settings.tls.certFile))
    return list(dict.fromkeys(found))


def target_certificates(spec: TaskSpec) -> list[ClientCertificate]:
    """A task's target Milvus's (a Kafka target takes no client certificate)."""
    return [] if spec.is_kafka else milvus_certificates(spec.target_param)


def milvus_certificates(connect: dict[str, Any]) -> list[ClientCertificate]:
    """A target Milvus's client certificate (``milvus_connect_param``'s ``dial_config``)."""
    path = (connect.get("dial_config") or {}).get("client_pem_path") or ""
    if not path:
        return []
    from server.tasks.target_check import describe_target

    return [ClientCertificate("target", describe_target(connect), path)]


def expiry_warning(cert: ClientCertificate, expiry: CertificateExpiry, now: float) -> str:
    """``target https://10.0.0.5:19530: client certificate /etc/cdc/client.pem expires at
    2026-12-20T00:00:00Z (in 13.5 days)``, or ``... expired at ...``."""
    left = expiry.seconds_left(now)
    told = "" if left <= 0 else f" (in {left / DAY:.1f} days)"
    return f"{cert.role} {cert.endpoint}: {expiry.describe(now)}{told}"


class CertificateWatch:
    """The expiry of each certificate last looked at, and the ones to warn of."""

    def __init__(self, warning_days: float) -> None:
        self.warning_seconds = warning_days * DAY
        self.expiries: dict[ClientCertificate, CertificateExpiry] = {}

    def look(self, certificates: Iterable[ClientCertificate]) -> None:
        """Read each certificate's expiry (a file that cannot be read is left out: its client
        says why it cannot connect)."""
        found = {}
        for cert in certificates:
            expiry = certificate_expiry(cert.path)
            if expiry is not None:
                found[cert] = expiry
        self.expiries = found

    def due(self, cert: ClientCertificate, now: float) -> CertificateExpiry | None:
        """``cert``'s expiry when it is within the warning's reach (or past)."""
        expiry = self.expiries.get(cert) or certificate_expiry(cert.path)
        if expiry is None or expiry.seconds_left(now) > self.warning_seconds:
            return None
        return expiry

    def warnings(self, certificates: Iterable[ClientCertificate], now: float) -> list[str]:
        return [
            expiry_warning(cert, expiry, now)
            for cert in certificates
            if (expiry := self.due(cert, now)) is not None
        ]

    def notices(self, now: float | None = None) -> list[dict[str, Any]]:
        """For /readyz: each certificate expired or expiring within the warning's reach."""
        now = time.time() if now is None else now
        return [
            {
                "role": cert.role,
                "endpoint": cert.endpoint,
                "file": cert.path,
                "expires_at": expiry.when,
                "expired": expiry.expired(now),
                "warning": expiry_warning(cert, expiry, now),
            }
            for cert, expiry in self.expiries.items()
            if self.due(cert, now) is not None
        ]


class CertificateCollector(Collector):
    """``cdc_certificate_expiry_seconds`` of every certificate the watch last looked at."""

    def __init__(self, watch: CertificateWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterable[Metric]:
        expiry = GaugeMetricFamily(
            "cdc_certificate_expiry_seconds",
            "Seconds until a client certificate the daemon presents expires (negative: expired), "
            "by the endpoint it is presented to and its file",
            labels=["role", "endpoint", "file"],
        )
        now = time.time()
        for cert, left in self._watch.expiries.items():
            expiry.add_metric([cert.role, cert.endpoint, cert.path], left.seconds_left(now))
        yield expiry


__all__ = [
    "CertificateCollector",
    "CertificateWatch",
    "ClientCertificate",
    "daemon_certificates",
    "expiry_warning",
    "milvus_certificates",
    "source_certificates",
    "target_certificates",
]
