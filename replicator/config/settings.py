"""The daemon's configuration: ``configs/cdc.yaml`` plus environment overrides.

Keys keep the camelCase of the Go milvus-cdc's ``cdc.yaml``. Every key can be overridden from the
environment as ``CDC_`` followed by the key path joined with ``__`` (case does not matter)::

    CDC_ADDRESS=127.0.0.1:8444
    CDC_METASTORECONFIG__STORETYPE=mysql
    CDC_METASTORECONFIG__ETCD__ADDRESS='["http://10.0.0.1:2379","http://10.0.0.2:2379"]'

Values are read as YAML (numbers, booleans, lists) except for string keys, which take the text
as it is. ``CDC_CONFIG`` names the configuration file and is not a key. An unknown key, in the
file or the environment, a wrong type or a missing required value stops start-up with a
``ConfigError`` that names the key.

The sections of ``CdcSettings`` live in :mod:`replicator.config.connections`,
:mod:`replicator.config.daemon` and :mod:`replicator.config.security`; they can be imported from
here too. What may be shown or logged of the settings is :mod:`replicator.config.redaction`.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from replicator.config.connections import (
    EtcdSettings,
    KafkaSettings,
    MetaStoreSettings,
    PulsarSettings,
    RocksmqSettings,
    SourceEtcdSettings,
    SourceSettings,
)
from replicator.config.daemon import (
    BackfillSettings,
    FleetSettings,
    MemorySettings,
    RetrySettings,
    SchedulerSettings,
    VerifySettings,
)
from replicator.config.milvus_endpoint import SourceMilvusSettings, milvus_param
from replicator.config.security import AuthSettings, SecretsSettings, TlsSettings, TokenSettings
from replicator.config.task_spec import DEFAULT_SOURCE, TaskSpec

__all__ = [
    "CLIENT_ENV",
    "DEFAULT_SOURCE",
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "AuthSettings",
    "BackfillSettings",
    "CdcEnvSource",
    "CdcSettings",
    "ConfigError",
    "EtcdSettings",
    "FleetSettings",
    "KafkaSettings",
    "MemorySettings",
    "MetaStoreSettings",
    "PulsarSettings",
    "RetrySettings",
    "RocksmqSettings",
    "SchedulerSettings",
    "SecretsSettings",
    "SourceEtcdSettings",
    "SourceMilvusSettings",
    "SourceSettings",
    "TlsSettings",
    "TokenSettings",
    "VerifySettings",
    "describe_validation_error",
    "load_settings",
    "milvus_param",
    "read_config_file",
    "split_host_port",
    "unused_settings",
]

ENV_PREFIX = "CDC_"
ENV_CONFIG_FILE = "CDC_CONFIG"
# Variables of the ``milvus-cdc task`` client (and the file name above), not configuration keys.
CLIENT_ENV = frozenset({ENV_CONFIG_FILE, "CDC_URL", "CDC_TOKEN", "CDC_CACERT"})


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


class CdcSettings(BaseSettings):
    model_config = SettingsConfigDict(
        extra="forbid", validate_default=True, coerce_numbers_to_str=True
    )

    address: str = "0.0.0.0:8444"
    maxTaskNum: int = Field(default=100, gt=0)
    maxNameLength: int = Field(default=256, gt=0, le=1024)
    metaStoreConfig: MetaStoreSettings = Field(default_factory=MetaStoreSettings)
    sourceConfig: SourceSettings = Field(default_factory=SourceSettings)
    # Daemon settings beyond the Go tool's keys.
    # ours: named clusters (README "Disaster recovery"), each shaped like sourceConfig, its
    # ``milvus`` the cluster's endpoint: a task reads from its source_cluster (default: the
    # sourceConfig source) and may write to a target_cluster; one daemon runs A->B and B->A.
    clusters: dict[str, SourceSettings] = Field(default_factory=dict)
    logLevel: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    logFormat: Literal["auto", "json", "console"] = "auto"
    maxRequestBytes: int = Field(default=1024 * 1024, ge=1024)
    drainTimeoutSeconds: float = Field(default=30.0, gt=0)
    # ours: the processes a task with a Kafka target runs its channels in, unless the task's
    # kafka_connect_param.processes says (1: the daemon's own; see docs, Kafka target)
    kafkaTargetProcesses: int = Field(default=1, ge=1, le=64)
    # ours: how long a thread runs Python before one waiting for the interpreter lock takes it
    # (sys.setswitchinterval); Python's 5 ms made a Kafka target's catch-up spend a fifth of
    # its CPU handing the lock between channels (bench/results/kafka_sink.md)
    gilSwitchMs: float = Field(default=50.0, gt=0, le=1000)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    backfill: BackfillSettings = Field(default_factory=BackfillSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_host_port(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what load_settings passes in: it has already merged the file and CDC_* variables.
        return (init_settings,)

    @field_validator("clusters")
    @classmethod
    def _cluster_names(cls, value: dict[str, SourceSettings]) -> dict[str, SourceSettings]:
        for name in value:
            if name == DEFAULT_SOURCE or not _CLUSTER_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a cluster name: 1-64 letters, digits, '_', '-' or '.', "
                    f"starting with a letter or digit, and not {DEFAULT_SOURCE!r}"
                )
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        return split_host_port(self.address)

    def cluster(self, name: str | None) -> SourceSettings:
        """The settings of a named cluster; None, "" or ``sourceConfig``: the default source.
        An unknown name raises ``KeyError`` naming it and the names configured."""
        if not name or name == DEFAULT_SOURCE:
            return self.sourceConfig
        try:
            return self.clusters[name]
        except KeyError:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise KeyError(
                f"no cluster named {name!r} in the daemon's configuration (clusters: {known})"
            ) from None

    def source_of(self, spec: TaskSpec) -> SourceSettings:
        """The source settings a task reads (its ``source_cluster``)."""
        return self.cluster(spec.source_cluster)


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class CdcEnvSource(PydanticBaseSettingsSource):
    """``CDC_A__B__C`` environment variables as a nested dict, matched case-insensitively
    against the model's keys; an unmatched variable is an error that names it."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ builds the whole tree at once

    def __call__(self) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for name, raw in sorted(self._environ.items()):
            if not name.upper().startswith(ENV_PREFIX) or name.upper() in CLIENT_ENV:
                continue
            path = name[len(ENV_PREFIX) :].split("__")
            model: type[BaseModel] | None = self.settings_cls
            node = tree
            for depth, part in enumerate(path):
                fields = model.model_fields if model is not None else {}
                key = next((k for k in fields if k.lower() == part.lower()), None)
                if key is None:
                    raise ConfigError(
                        f"environment variable {name}: unknown configuration key "
                        f"{'.'.join(path[: depth + 1])!r}"
                    )
                annotation = fields[key].annotation
                if depth == len(path) - 1:
                    node[key] = _env_value(raw, annotation)
                else:
                    model = _model_of(annotation)
                    if model is None:
                        raise ConfigError(f"environment variable {name}: {key!r} has no sub-keys")
                    node = node.setdefault(key, {})
        return tree


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _env_value(raw: str, annotation: Any) -> Any:
    candidates = (
        get_args(annotation) if get_origin(annotation) in (typing.Union, types.UnionType) else ()
    )
    if annotation in (str, SecretStr) or str in candidates:
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # validation names the key and the expected type


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must hold a mapping of keys")
    return data


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem, naming the key path, never echoing the value (it may be secret)."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in error["loc"])
        where = f"{prefix}.{loc}" if prefix and loc else (loc or prefix or "(root)")
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required"
        message = message.removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> CdcSettings:
    """Read the file (``path``, else ``$CDC_CONFIG``, else defaults only) and overlay CDC_* vars."""
    env = os.environ if environ is None else environ
    path = path or env.get(ENV_CONFIG_FILE) or None
    data = read_config_file(path) if path else {}
    overrides = CdcEnvSource(CdcSettings, env)()
    try:
        return CdcSettings(**_deep_merge(data, overrides))
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {describe_validation_error(exc)}") from exc


def unused_settings(settings: CdcSettings) -> list[str]:
    """Keys of the Go tool's configuration this daemon accepts (a drop-in file must load) but
    does not use, when set to something other than their defaults: logged at start."""
    unused = []
    if settings.sourceConfig.pulsar.webAddress != PulsarSettings().webAddress:
        unused.append(
            "sourceConfig.pulsar.webAddress (Pulsar is read through its broker protocol at "
            "pulsar.address; the admin web address is never called)"
        )
    default_tls = EtcdSettings().tlsMinVersion
    for where, etcd in (
        ("sourceConfig.etcd", settings.sourceConfig.etcd),
        ("metaStoreConfig.etcd", settings.metaStoreConfig.etcd),
    ):
        if etcd.tlsMinVersion != default_tls:
            unused.append(
                f"{where}.tlsMinVersion (the gRPC client negotiates TLS 1.2 or 1.3 itself; the "
                "minimum cannot be set)"
            )
    return unused
