"""The settings that turn a server's certificate check off, or part of it: each is explicit (its
default verifies) and said as a warning at every start of the daemon (the MySQL metastore's
``insecure_skip_verify`` when the store is opened: replicator/config/stores.py)."""

from __future__ import annotations

from replicator.config.connections import SourceSettings
from replicator.config.settings import CdcSettings


def insecure_settings(settings: CdcSettings) -> list[str]:
    """One line per such setting of the source and of every named cluster."""
    sources = [("sourceConfig", settings.sourceConfig)]
    sources += [(f"clusters.{name}", source) for name, source in sorted(settings.clusters.items())]
    return [line for where, source in sources for line in _source_lines(where, source)]


def _source_lines(where: str, source: SourceSettings) -> list[str]:
    lines = []
    if source.pulsar.tlsAllowInsecureConnection:
        lines.append(
            f"{where}.pulsar.tlsAllowInsecureConnection is true: any certificate a Pulsar broker "
            "shows is accepted; whoever poses as the broker reads the WAL and the credentials"
        )
    if source.kafka.ssl.enabled and not source.kafka.ssl.verifyHostname:
        lines.append(
            f"{where}.kafka.ssl.verifyHostname is false: a Kafka broker's certificate need not "
            "name the host dialled (its chain is still checked)"
        )
    return lines


__all__ = ["insecure_settings"]
