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
"""

from __future__ import annotations

import hashlib
import os
import re
import types
import typing
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import quote

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from sqlalchemy.engine import make_url

from metastore.etcd_connect import parse_etcd_address
from metastore.sql_engine import mysql_url_from_source

ENV_PREFIX = "CDC_"
ENV_CONFIG_FILE = "CDC_CONFIG"
# Variables of the ``milvus-cdc task`` client (and the file name above), not configuration keys.
CLIENT_ENV = frozenset({ENV_CONFIG_FILE, "CDC_URL", "CDC_TOKEN", "CDC_CACERT"})


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


class _Section(BaseModel):
    # coerce_numbers_to_str: the Go tool's template has `tlsMinVersion: 1.3`, which YAML reads as
    # a number; a drop-in configuration must load as it is.
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)


class EtcdSettings(_Section):
    address: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:2379"])
    enableAuth: bool = False
    username: str = "root"
    password: SecretStr = SecretStr("")
    enableTLS: bool = False
    tlsCertPath: str = ""
    tlsKeyPath: str = ""
    tlsCACertPath: str = ""
    tlsMinVersion: str = "1.3"

    @field_validator("address")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one etcd address is required")
        for address in value:
            parse_etcd_address(address)
        return value


class SourceEtcdSettings(EtcdSettings):
    rootPath: str = "by-dev"
    metaSubPath: str = "meta"


class MetaStoreSettings(_Section):
    storeType: Literal["sqlite", "mysql", "etcd"] = "sqlite"
    sqlitePath: str = "data/cdc-meta.sqlite3"
    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    mysqlSourceUrl: SecretStr = SecretStr("")
    rootPath: str = "cdc"

    @field_validator("rootPath")
    @classmethod
    def _root_path(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.\-/]{1,128}", value) or not value.strip("/"):
            raise ValueError("must be 1-128 characters of letters, digits, '_', '-', '.', '/'")
        return value

    @model_validator(mode="after")
    def _required_for_type(self) -> MetaStoreSettings:
        if self.storeType == "mysql":
            if not self.mysqlSourceUrl.get_secret_value():
                raise ValueError("mysqlSourceUrl is required when storeType is mysql")
            mysql_url_from_source(self.mysqlSourceUrl.get_secret_value())  # names the problem
        if self.storeType == "sqlite" and not self.sqlitePath:
            raise ValueError("sqlitePath is required when storeType is sqlite")
        return self


class PulsarSettings(_Section):
    address: str = "pulsar://localhost:6650"
    webAddress: str = "localhost:80"
    maxMessageSize: int = Field(default=5242880, gt=0)
    tenant: str = "public"
    namespace: str = "default"
    authPlugin: str = ""
    authParams: SecretStr = SecretStr("")


class KafkaSettings(_Section):
    address: str = ""
    # ours: the longest a caught-up channel reader's fetch waits at the broker (librdkafka's
    # fetch.wait.max.ms, whose default it keeps). A Kafka broker answers as soon as a record
    # arrives: this is the rate of empty fetches of a quiet channel, not lag, except on a
    # broker that holds a fetch for the whole wait (librdkafka's mock cluster, which the
    # tests and benchmarks use: bench/lag.py sets 20)
    fetchWaitMs: int = Field(default=500, ge=1, le=60_000)


class RocksmqSettings(_Section):
    path: str = ""


class SourceMilvusSettings(_Section):
    """ours: the source Milvus's gRPC address; only a backfill reads through it."""

    uri: str = ""
    username: str = ""
    password: SecretStr = SecretStr("")
    token: SecretStr = SecretStr("")


class SourceSettings(_Section):
    # ours: the source's message queue; auto: kafka when kafka.address is set, else rocksmq
    # when rocksmq.path is set, else pulsar (the Go tool's rule).
    mqType: Literal["auto", "kafka", "pulsar", "rocksmq"] = "auto"
    etcd: SourceEtcdSettings = Field(default_factory=SourceEtcdSettings)
    etcdRootPath: str | None = None
    etcdMetaSubPath: str | None = None
    defaultPartitionName: str = "_default"
    # how many read batches (each at most 1000 records and about 8 MB) a channel reads ahead of
    # the target's acknowledgements: per channel at most (readChanLen + 1) x 8 MB of records
    readChanLen: int = Field(default=2, gt=0, le=64)
    # ours: the tasks of this daemon share one reader per source channel, which holds at most
    # readChanLen x 8 MB (+ one read) of records; a task further behind reads on its own
    # (README "Memory and many tasks"). false: every task reads every channel itself.
    sharedReaders: bool = True
    # ours: the source's common.chanNamePrefix.cluster (null: the etcd root path) and
    # rootCoord.dmlChannelNum; the daemon reads <prefix>-rootcoord-dml_0 .. _<n-1>.
    channelPrefix: str | None = None
    dmlChannelNum: int = Field(default=16, gt=0, le=1024)
    pulsar: PulsarSettings = Field(default_factory=PulsarSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    rocksmq: RocksmqSettings = Field(default_factory=RocksmqSettings)
    milvus: SourceMilvusSettings = Field(default_factory=SourceMilvusSettings)

    @property
    def root_path(self) -> str:
        """``etcdRootPath`` when given, else ``etcd.rootPath`` (both spellings are in use)."""
        return self.etcdRootPath or self.etcd.rootPath

    @property
    def meta_sub_path(self) -> str:
        return self.etcdMetaSubPath or self.etcd.metaSubPath

    @model_validator(mode="after")
    def _queue_configured(self) -> SourceSettings:
        if self.mqType == "kafka" and not self.kafka.address:
            raise ValueError("kafka.address is required when mqType is kafka")
        if self.mqType == "rocksmq" and not self.rocksmq.path:
            raise ValueError("rocksmq.path is required when mqType is rocksmq")
        if self.mqType == "pulsar" and not self.pulsar.address:
            raise ValueError("pulsar.address is required when mqType is pulsar")
        return self

    @property
    def mq_type(self) -> str:
        if self.mqType != "auto":
            return self.mqType
        if self.kafka.address:
            return "kafka"
        return "rocksmq" if self.rocksmq.path else "pulsar"

    @property
    def channel_prefix(self) -> str:
        """The source's common.chanNamePrefix.cluster: ``channelPrefix``, else the root path."""
        return self.channelPrefix or self.root_path

    @property
    def dml_channels(self) -> list[str]:
        return [f"{self.channel_prefix}-rootcoord-dml_{i}" for i in range(self.dmlChannelNum)]

    @property
    def replicate_channel(self) -> str:
        """The source names it ``<chanNamePrefix.cluster>-<chanNamePrefix.replicateMsg>``; the
        second part is ``replicate-msg`` unless the source changed it (then name the channel
        in the create request's ``rpc_channel_info``)."""
        return f"{self.channel_prefix}-replicate-msg"


DEFAULT_TRANSIENT_REASONS = [
    "cannot start:",
    "unavailable",
    "deadline_exceeded",
    "connection refused",
    "connection reset",
    "timed out",
]


class RetrySettings(_Section):
    """ours: resume tasks stopped by a transient error, with exponential backoff."""

    enabled: bool = True
    checkSeconds: float = Field(default=5.0, gt=0)
    initialBackoffSeconds: float = Field(default=10.0, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    maxBackoffSeconds: float = Field(default=600.0, gt=0)
    maxAttempts: int = Field(default=0, ge=0)
    transientReasons: list[str] = Field(default_factory=lambda: list(DEFAULT_TRANSIENT_REASONS))


class SchedulerSettings(_Section):
    """ours: the daemon's periodic jobs (APScheduler)."""

    progressSampleSeconds: float = Field(default=5.0, gt=0)
    metastoreCheckSeconds: float = Field(default=10.0, gt=0)
    # how often the source's queue and etcd and each running task's target are probed; an
    # endpoint that does not answer is a warning on the tasks that use it (server/reachability.py)
    reachabilitySeconds: float = Field(default=2.0, gt=0)
    retry: RetrySettings = Field(default_factory=RetrySettings)


class BackfillSettings(_Section):
    """ours: the Spark job that copies a task's existing rows (see README, "Backfill")."""

    # local[*] runs Spark inside the job's own process; spark://host:7077, yarn, k8s://...
    # send it to a cluster (the executors need pymilvus and this package).
    sparkMaster: str = "local[*]"
    # attempts of one Spark task (one key range) before the backfill stops
    taskMaxFailures: int = Field(default=4, ge=1)
    # rows per key range (one Spark task each); a collection gets ceil(rows / rangeRows) ranges
    rangeRows: int = Field(default=25000, gt=0)
    # rows per read from the source and per upsert into the target
    batchRows: int = Field(default=4000, gt=0, le=16384)
    # ranges copied at once; 0: Spark's default parallelism
    parallelism: int = Field(default=0, ge=0)
    # launches of the job's driver process per backfill; a killed driver is launched again and
    # resumes after the ranges already done
    maxJobAttempts: int = Field(default=3, ge=1)
    # the driver's output (Spark's own log lines included), one file per task
    logDir: str = "data/backfill"
    # extra Spark properties, e.g. {"spark.driver.memory": "1g"}
    sparkConf: dict[str, str] = Field(default_factory=dict)


class TokenSettings(_Section):
    """ours: one API token. ``token`` is hashed as soon as it is read (sha256; only the hash is
    kept); ``sha256`` gives the hash itself, so the file need not hold the token."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Literal["admin", "viewer"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="before")
    @classmethod
    def _hash_token(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "token" not in data:
            return data
        entry = dict(data)
        token = entry.pop("token")
        if isinstance(token, SecretStr):
            token = token.get_secret_value()
        if "sha256" in entry:
            raise ValueError("give token or sha256, not both")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"token: must be a string of at least {MIN_TOKEN_LENGTH} characters")
        entry["sha256"] = token_digest(token)
        return entry


MIN_TOKEN_LENGTH = 16


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class AuthSettings(_Section):
    """ours: who may call the API (see README, "Security")."""

    tokens: list[TokenSettings] = Field(default_factory=list)
    # no token configured: the daemon listens on 127.0.0.1 only, unless this is true
    allowAnonymous: bool = False
    # true: /metrics asks for a token too (viewer or admin)
    protectMetrics: bool = False

    @field_validator("tokens")
    @classmethod
    def _distinct(cls, tokens: list[TokenSettings]) -> list[TokenSettings]:
        names = [t.name for t in tokens]
        if len(set(names)) != len(names):
            raise ValueError("token names must be distinct")
        if len({t.sha256 for t in tokens}) != len(tokens):
            raise ValueError("two tokens are the same")
        return tokens


class TlsSettings(_Section):
    """ours: serve HTTPS with this certificate (chain) and key, both PEM files."""

    certFile: str = ""
    keyFile: str = ""

    @model_validator(mode="after")
    def _both(self) -> TlsSettings:
        if bool(self.certFile) != bool(self.keyFile):
            raise ValueError("certFile and keyFile go together: give both or neither")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.certFile)


class SecretsSettings(_Section):
    """ours: the key ring that encrypts the secrets of tasks in the metastore (README,
    "Security"). ``key`` (e.g. ``CDC_SECRETS__KEY``) wins over ``keyFile``; with neither
    present, a key file is made at ``keyFile`` on first start."""

    keyFile: str = "data/cdc-secret.key"
    key: SecretStr = SecretStr("")


class VerifySettings(_Section):
    """ours: comparing a task's target with its source (see README, "Verifying a task")."""

    # keys per range; a range is read from both sides and compared as a count and a digest
    rangeRows: int = Field(default=10000, gt=0)
    # rows per read
    batchRows: int = Field(default=5000, gt=0, le=16384)
    # reads of a differing range after the first, each once the task applied the one before;
    # a range still changing after them is reported as unsettled, not as divergent
    tries: int = Field(default=4, ge=1)
    # seconds to wait for the task to apply what was written before a read
    settleSeconds: float = Field(default=60.0, gt=0)
    # ranges of a collection compared at once (threads of the daemon)
    parallelism: int = Field(default=2, ge=1, le=64)
    # collections of at least this many rows have their range digests computed as a Spark job
    # (backfill.sparkMaster, backfill.sparkConf), smaller ones in the daemon; 0: never Spark.
    # A Spark session takes 5-60 s to start (local[2] on a shared 2-core machine): what the
    # daemon needs to digest a few million rows
    sparkMinRows: int = Field(default=10_000_000, ge=0)
    # scheduled verification of every Running task, in hours (0: none unless a task's create
    # asks with verify.intervalHours); each run covers a random sampleFraction of the ranges
    intervalHours: float = Field(default=0.0, ge=0)
    sampleFraction: float = Field(default=0.1, gt=0, le=1)
    # how often the scheduler looks for a verify that is due
    scheduleCheckSeconds: float = Field(default=60.0, gt=0)


class FleetSettings(_Section):
    """ours: daemons sharing one metastore (etcd or MySQL) share its tasks (README, "Running
    several daemons"). Each Running task is run by the daemon holding its lease."""

    # a daemon that stops renewing (killed, cut off) loses its tasks after this long; it stops
    # writing itself after two thirds of it without a renewal, before anyone else may start
    leaseSeconds: float = Field(default=10.0, ge=2)
    # how often a daemon renews its leases and looks for tasks to take, hand over or stop
    checkSeconds: float = Field(default=1.0, gt=0)
    # this daemon's name in the fleet (the `owner` get and list show); default host:port. Two
    # daemons must never share one: each would take the other's leases for its own
    memberId: str = Field(default="", max_length=128)

    @model_validator(mode="after")
    def _renewed_in_time(self) -> FleetSettings:
        if self.checkSeconds * 4 > self.leaseSeconds:
            raise ValueError(
                f"fleet.checkSeconds ({self.checkSeconds:g}) must be at most a quarter of "
                f"fleet.leaseSeconds ({self.leaseSeconds:g}): leases are renewed every check"
            )
        return self


class MemorySettings(_Section):
    """ours: the daemon's malloc (server/heap.py; bench/results/backlog.md)."""

    # at most this many malloc arenas (glibc makes up to 8 per core); 0: glibc's default. An
    # operator's MALLOC_ARENA_MAX wins
    mallocArenas: int = Field(default=2, ge=0, le=64)
    # how often the freed memory malloc keeps is looked at; it is given back (malloc_trim) when
    # RSS grew more than trimAboveMB since the last trim and malloc holds as much free; 0: never
    trimSeconds: float = Field(default=1.0, ge=0)
    trimAboveMB: int = Field(default=32, ge=0)


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

    def source_of(self, spec: Mapping[str, Any]) -> SourceSettings:
        """The source settings a task reads (its ``source_cluster``)."""
        return self.cluster(spec.get("source_cluster"))


# the name a task's source_cluster takes for the daemon's sourceConfig
DEFAULT_SOURCE = "sourceConfig"
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def milvus_param(milvus: SourceMilvusSettings) -> dict[str, str]:
    """A cluster's Milvus endpoint as pymilvus takes it (secrets revealed: never log it)."""
    return {
        "uri": milvus.uri,
        "username": milvus.username,
        "password": milvus.password.get_secret_value(),
        "token": milvus.token.get_secret_value(),
    }


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


def redacted(settings: CdcSettings) -> dict[str, Any]:
    """The merged configuration for display, secrets replaced by '******'."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    _redact_tree(data)
    return data


_SECRET_KEYS = {"password", "token", "authparams", "mysqlsourceurl", "key", "sha256"}


def _redact_tree(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key.lower() in _SECRET_KEYS and value:
                node[key] = "******"
            else:
                _redact_tree(value)
    elif isinstance(node, list):
        for item in node:
            _redact_tree(item)


def secret_values(node: Any) -> list[str]:
    """Every secret the configuration holds, for the log redactor: each ``SecretStr`` (at any
    depth) and the password inside ``mysqlSourceUrl``, also as the URL spells it."""
    found: list[str] = []
    if isinstance(node, SecretStr):
        found.append(node.get_secret_value())
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            found.extend(secret_values(getattr(node, name)))
    elif isinstance(node, list | tuple):
        for item in node:
            found.extend(secret_values(item))
    elif isinstance(node, dict):
        for item in node.values():
            found.extend(secret_values(item))
    if isinstance(node, MetaStoreSettings) and node.mysqlSourceUrl.get_secret_value():
        url = make_url(mysql_url_from_source(node.mysqlSourceUrl.get_secret_value()))
        if url.password:
            found.extend([str(url.password), quote(str(url.password), safe="")])
    return [s for s in found if s]


def scrub_secret_environment(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the ``CDC_`` variables that hold secrets once the settings are read, so child
    processes (the backfill driver gets its settings on stdin) do not inherit them; returns the
    names removed."""
    removed = []
    for name in list(environ):
        upper = name.upper()
        last = upper.rsplit("__", 1)[-1].lower()
        if upper.startswith(ENV_PREFIX) and upper not in CLIENT_ENV and last in _SECRET_ENV:
            del environ[name]
            removed.append(name)
    return removed


_SECRET_ENV = {*_SECRET_KEYS, "tokens"}


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
