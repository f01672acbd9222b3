"""One way to open a source WAL by kind: the daemon's configured source, and a WAL the source
switched to while running, whose settings come from the switch message (seeds/mq-switch-api.zh.md
``_mq_switch_config_<key>``, AlterWAL's config map) or else from the daemon's configuration.

Setting names a switch message may carry (Milvus names them freely; these are the ones its
documentation and configuration use), per kind:

- kafka: ``broker_address`` | ``address`` | ``bootstrap_servers`` | ``bootstrap.servers``;
  ``security_protocol``, ``sasl_mechanisms``/``sasl_mechanism``, ``sasl_username``,
  ``sasl_password`` (and their dotted librdkafka spellings); a message that names none of these
  is read with the daemon's configured security of that cluster (``kafka.saslUsername``,
  ``kafka.ssl``...), one that names any of them with its own alone;
- rocksmq: ``path``;
- pulsar: ``address`` | ``broker_address``, ``tenant``, ``namespace``, ``auth_plugin``,
  ``auth_params``.

Anything else is ignored with a warning that names the key, never the value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replicator.errors import SourceConfigError
from replicator.sources.base import WalSource

log = logging.getLogger(__name__)

_KAFKA_ADDRESS = ("broker_address", "address", "bootstrap_servers", "bootstrap.servers")
_KAFKA_EXTRA = {
    "security_protocol": "security.protocol",
    "sasl_mechanisms": "sasl.mechanisms",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
}
# the librdkafka settings that make a client's security
_KAFKA_SECURITY = ("security.", "sasl.", "ssl.")
_PULSAR = {
    "address": "address",
    "broker_address": "address",
    "tenant": "tenant",
    "namespace": "namespace",
    "auth_plugin": "auth_plugin",
    "auth_params": "auth_params",
}


@dataclass(frozen=True)
class WalDefaults:
    """The daemon's own settings per kind, used where a switch message gives none."""

    kafka_address: str = ""
    kafka_extra: dict[str, Any] = field(default_factory=dict)
    rocksmq_path: str = ""
    pulsar: dict[str, Any] = field(default_factory=dict)  # PulsarSource keyword arguments


def open_source(kind: str, config: Mapping[str, str], defaults: WalDefaults) -> WalSource:
    if kind == "kafka":
        from replicator.sources.kafka import KafkaSource

        address = _first(config, _KAFKA_ADDRESS) or defaults.kafka_address
        if not address:
            raise SourceConfigError("kafka: no broker address (in the message or kafka.address)")
        named = {
            _KAFKA_EXTRA.get(key, key): value
            for key, value in config.items()
            if key in _KAFKA_EXTRA or key in _KAFKA_EXTRA.values()
        }
        extra = dict(defaults.kafka_extra)
        if named:  # the message's security replaces the configured one, never mixes with it
            extra = {k: v for k, v in extra.items() if not k.startswith(_KAFKA_SECURITY)}
        extra.update(named)
        _ignore(kind, config, {*_KAFKA_ADDRESS, *_KAFKA_EXTRA, *_KAFKA_EXTRA.values()})
        return KafkaSource(address, extra)
    if kind == "rocksmq":
        from replicator.sources.rocksmq import RocksmqSource

        path = config.get("path") or defaults.rocksmq_path
        if not path:
            raise SourceConfigError("rocksmq: no path (in the message or rocksmq.path)")
        _ignore(kind, config, {"path"})
        return RocksmqSource(path)
    if kind == "pulsar":
        from replicator.sources.pulsar import PulsarSource

        settings = dict(defaults.pulsar)
        settings.update({_PULSAR[k]: v for k, v in config.items() if k in _PULSAR})
        _ignore(kind, config, set(_PULSAR))
        if not settings.get("address"):
            raise SourceConfigError("pulsar: no address (in the message or pulsar.address)")
        address = settings.pop("address")
        return PulsarSource(address, **settings)
    raise SourceConfigError(f"no reader for a {kind!r} WAL")


def _first(config: Mapping[str, str], keys: tuple[str, ...]) -> str:
    return next((config[k] for k in keys if config.get(k)), "")


def _ignore(kind: str, config: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(set(config) - known)
    if unknown:
        log.warning("%s: switch settings not understood and ignored: %s", kind, ", ".join(unknown))
