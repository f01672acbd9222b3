"""Where the daemon connects: etcd, its metastore, and a source cluster (queue, etcd, Milvus)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from metastore.etcd_addresses import parse_etcd_address
from metastore.sql_urls import mysql_url_from_source
from replicator.config.milvus_endpoint import SourceMilvusSettings
from replicator.config.section import ConfigSection

# milvus.yaml's spelling of an etcd block (``etcd.endpoints``, ``etcd.ssl.*``,
# ``etcd.auth.*``) -> the Go tool's, which these settings keep
_MILVUS_ETCD_SSL = {
    "enabled": "enableTLS",
    "tlsCert": "tlsCertPath",
    "tlsKey": "tlsKeyPath",
    "tlsCACert": "tlsCACertPath",
    "tlsMinVersion": "tlsMinVersion",
}
_MILVUS_ETCD_AUTH = {"enabled": "enableAuth", "userName": "username", "password": "password"}


def _milvus_etcd_spelling(value: Any) -> Any:
    """Read ``endpoints``, ``ssl:`` and ``auth:`` as milvus.yaml writes them; a block that
    spells one thing both ways is refused by name."""
    if not isinstance(value, dict):
        return value
    given = dict(value)
    endpoints = given.pop("endpoints", None)
    if endpoints is not None:
        if "address" in given:
            raise ValueError("etcd: give address or endpoints (milvus.yaml's), not both")
        listed = endpoints.split(",") if isinstance(endpoints, str) else endpoints
        given["address"] = [str(e).strip() for e in listed if str(e).strip()]
    for block, keys in (("ssl", _MILVUS_ETCD_SSL), ("auth", _MILVUS_ETCD_AUTH)):
        section = given.pop(block, None)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ValueError(f"etcd.{block}: expected a mapping")
        for key, item in section.items():
            if key not in keys:
                raise ValueError(f"etcd.{block}.{key}: unknown key")
            if item is None:  # left empty in milvus.yaml: the default
                continue
            if keys[key] in given:
                raise ValueError(f"etcd: give {block}.{key} or {keys[key]}, not both")
            given[keys[key]] = item
    return given


class PasswordSource:
    """Where a section's password is read again when its server refuses the one in use (it
    was changed there): the daemon's configuration file (server/cli/serve.py); None: only the
    one given at start."""

    _password_source: Callable[[], str] | None = PrivateAttr(default=None)

    @property
    def password_source(self) -> Callable[[], str] | None:
        return self._password_source

    def read_password_from(self, source: Callable[[], str]) -> None:
        self._password_source = source


class EtcdSettings(PasswordSource, ConfigSection):
    address: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:2379"])
    enableAuth: bool = False
    username: str = "root"
    password: SecretStr = SecretStr("")
    enableTLS: bool = False
    tlsCertPath: str = ""
    tlsKeyPath: str = ""
    tlsCACertPath: str = ""
    tlsMinVersion: str = "1.3"

    _milvus_spelling = model_validator(mode="before")(_milvus_etcd_spelling)

    @model_validator(mode="after")
    def _tls_files(self) -> EtcdSettings:
        if not self.enableTLS:
            return self
        files = {
            "tlsCACertPath": self.tlsCACertPath,
            "tlsCertPath": self.tlsCertPath,
            "tlsKeyPath": self.tlsKeyPath,
        }
        for key, path in files.items():
            if path and not os.path.isfile(path):
                raise ValueError(f"etcd.{key}: no such file: {path}")
        if bool(self.tlsCertPath) != bool(self.tlsKeyPath):
            raise ValueError("etcd.tlsCertPath and etcd.tlsKeyPath go together (mutual TLS)")
        return self

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


class MetaStoreSettings(PasswordSource, ConfigSection):  # the MySQL URL's password
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


class PulsarSettings(ConfigSection):
    address: str = "pulsar://localhost:6650"
    webAddress: str = "localhost:80"
    maxMessageSize: int = Field(default=5242880, gt=0)
    tenant: str = "public"
    namespace: str = "default"
    authPlugin: str = ""
    authParams: SecretStr = SecretStr("")
    # ours, named as the Java client's settings: TLS to a ``pulsar+ssl://`` address
    tlsTrustCertsFilePath: str = ""  # the brokers' CA (empty: the system's)
    tlsEnableHostnameVerification: bool = True  # pulsar-client's default is false
    tlsAllowInsecureConnection: bool = False  # true: any broker certificate is accepted
    tlsCertificateFilePath: str = ""  # mutual TLS without the tls authPlugin
    tlsKeyFilePath: str = ""

    @model_validator(mode="after")
    def _tls_consistent(self) -> PulsarSettings:
        files = {
            "tlsTrustCertsFilePath": self.tlsTrustCertsFilePath,
            "tlsCertificateFilePath": self.tlsCertificateFilePath,
            "tlsKeyFilePath": self.tlsKeyFilePath,
        }
        tls = self.address.strip().startswith("pulsar+ssl://")
        for key, path in files.items():
            if path and not tls:
                raise ValueError(f"pulsar.{key} is set but pulsar.address is not pulsar+ssl://")
            if path and not os.path.isfile(path):
                raise ValueError(f"pulsar.{key}: no such file: {path}")
        if bool(self.tlsCertificateFilePath) != bool(self.tlsKeyFilePath):
            raise ValueError("pulsar.tlsCertificateFilePath and pulsar.tlsKeyFilePath go together")
        return self

    def source_kwargs(self) -> dict[str, Any]:
        """``PulsarSource``'s keyword arguments (secrets in clear: for the client only)."""
        return {
            "address": self.address,
            "tenant": self.tenant,
            "namespace": self.namespace,
            "auth_plugin": self.authPlugin,
            "auth_params": self.authParams.get_secret_value(),
            "max_message_size": self.maxMessageSize,
            "tls": {
                "trust_certs_file": self.tlsTrustCertsFilePath,
                "validate_hostname": self.tlsEnableHostnameVerification,
                "allow_insecure": self.tlsAllowInsecureConnection,
                "cert_file": self.tlsCertificateFilePath,
                "key_file": self.tlsKeyFilePath,
            },
        }


def _unset_when_empty(value: Any) -> Any:
    """milvus.yaml leaves these keys empty (``saslUsername:``), which YAML reads as null: the
    default, so its block loads as it is."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    return value


class KafkaSslSettings(ConfigSection):
    """``kafka.ssl`` as milvus.yaml spells it: TLS to the brokers, files in PEM."""

    _empty_is_default = model_validator(mode="before")(_unset_when_empty)

    enabled: bool = False
    tlsCert: str = ""  # the client's certificate (mutual TLS), with tlsKey
    tlsKey: str = ""
    tlsCaCert: str = ""  # the CA the brokers' certificates are checked against (else the system's)
    tlsKeyPassword: SecretStr = SecretStr("")
    # ours: the broker's certificate must name the host the daemon dialled (librdkafka's
    # ssl.endpoint.identification.algorithm=https); false turns the check off, for brokers whose
    # certificates name another host. The chain is checked either way.
    verifyHostname: bool = True


KafkaSecurityProtocol = Literal["", "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# librdkafka also has GSSAPI and OAUTHBEARER; neither is configured by a user name and password,
# and milvus.yaml has no keys for what they need
KafkaSaslMechanism = Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSettings(ConfigSection):
    """A cluster's Kafka, in milvus.yaml's spelling (``kafka.saslUsername``, ``kafka.ssl``...)."""

    _empty_is_default = model_validator(mode="before")(_unset_when_empty)

    address: str = ""
    saslUsername: str = ""
    saslPassword: SecretStr = SecretStr("")
    saslMechanisms: KafkaSaslMechanism = ""
    # empty: SASL_SSL with a SASL user and ssl.enabled, SASL_PLAINTEXT with a user alone, SSL
    # with ssl.enabled alone, else PLAINTEXT
    securityProtocol: KafkaSecurityProtocol = ""
    ssl: KafkaSslSettings = Field(default_factory=KafkaSslSettings)
    # ours: the longest a caught-up channel reader's fetch waits at the broker (librdkafka's
    # fetch.wait.max.ms, whose default it keeps). A Kafka broker answers as soon as a record
    # arrives: this is the rate of empty fetches of a quiet channel, not lag, except on a
    # broker that holds a fetch for the whole wait (librdkafka's mock cluster, which the
    # tests and benchmarks use: bench/lag.py sets 20)
    fetchWaitMs: int = Field(default=500, ge=1, le=60_000)

    @property
    def security_protocol(self) -> str:
        """``securityProtocol``, else the one the SASL user and ``ssl.enabled`` imply."""
        if self.securityProtocol:
            return self.securityProtocol
        sasl, tls = bool(self.saslUsername), self.ssl.enabled
        return {
            (True, True): "SASL_SSL",
            (True, False): "SASL_PLAINTEXT",
            (False, True): "SSL",
            (False, False): "PLAINTEXT",
        }[(sasl, tls)]

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        protocol = self.security_protocol
        sasl = protocol.startswith("SASL_")
        tls = protocol.endswith("SSL")
        if self.saslMechanisms and not self.saslUsername:
            raise ValueError("kafka.saslMechanisms is set but kafka.saslUsername is empty")
        if sasl:
            if not self.saslUsername:
                raise ValueError(f"kafka.securityProtocol {protocol} needs kafka.saslUsername")
            if not self.saslPassword.get_secret_value():
                raise ValueError("kafka.saslUsername is set but kafka.saslPassword is empty")
            if not self.saslMechanisms:
                raise ValueError(
                    "kafka.saslUsername is set but kafka.saslMechanisms is empty "
                    "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                )
        elif self.saslUsername:
            raise ValueError(
                f"kafka.saslUsername is set but kafka.securityProtocol is {protocol} "
                "(SASL_PLAINTEXT or SASL_SSL use it)"
            )
        if self.ssl.enabled and not tls:
            raise ValueError(
                f"kafka.ssl.enabled is true but kafka.securityProtocol is {protocol} "
                "(SSL or SASL_SSL use TLS)"
            )
        files = {"tlsCert": self.ssl.tlsCert, "tlsKey": self.ssl.tlsKey}
        files["tlsCaCert"] = self.ssl.tlsCaCert
        for key, path in files.items():
            if path and not tls:
                raise ValueError(f"kafka.ssl.{key} is set but TLS is off (kafka.ssl.enabled)")
            if path and not os.path.isfile(path):
                raise ValueError(f"kafka.ssl.{key}: no such file: {path}")
        if bool(self.ssl.tlsCert) != bool(self.ssl.tlsKey):
            raise ValueError("kafka.ssl.tlsCert and kafka.ssl.tlsKey go together (mutual TLS)")
        if self.ssl.tlsKeyPassword.get_secret_value() and not self.ssl.tlsKey:
            raise ValueError("kafka.ssl.tlsKeyPassword is set but kafka.ssl.tlsKey is empty")
        return self

    def client_security(self) -> dict[str, str]:
        """The librdkafka settings of this security (secrets revealed: never log it), for every
        client of these brokers: readers, watermark reads, probes, ``milvus-cdc check``."""
        protocol = self.security_protocol
        config = {"security.protocol": protocol.lower()}
        if protocol.startswith("SASL_"):
            config["sasl.mechanisms"] = self.saslMechanisms
            config["sasl.username"] = self.saslUsername
            config["sasl.password"] = self.saslPassword.get_secret_value()
        if protocol.endswith("SSL"):
            verify = "https" if self.ssl.verifyHostname else "none"
            config["ssl.endpoint.identification.algorithm"] = verify
            optional = {
                "ssl.ca.location": self.ssl.tlsCaCert,
                "ssl.certificate.location": self.ssl.tlsCert,
                "ssl.key.location": self.ssl.tlsKey,
                "ssl.key.password": self.ssl.tlsKeyPassword.get_secret_value(),
            }
            config.update({k: v for k, v in optional.items() if v})
        return config

    def client_config(self) -> dict[str, str]:
        """``bootstrap.servers`` and the security settings (secrets revealed: never log it)."""
        return {"bootstrap.servers": self.address, **self.client_security()}


class RocksmqSettings(ConfigSection):
    path: str = ""


class SourceSettings(ConfigSection):
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
