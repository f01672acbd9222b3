"""A create request checked against the daemon's settings into the task's :class:`TaskSpec`.

Pydantic has checked the request's shapes and types (server/tasks/requests.py); here is what
needs the settings: name lengths, named clusters, the source's replicate channel, files,
selections and name mappings, a backfill's or a verify's collections. The result is the typed,
frozen spec (replicator/config/task_spec.py) that creation, admission, the target factory and
the runner read; its stored document is what the metastores keep.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from replicator.config.milvus_endpoint import SourceMilvusSettings, dial_config
from replicator.config.settings import DEFAULT_SOURCE, CdcSettings
from replicator.config.task_spec import DEFAULT_CONNECT_TIMEOUT, DEFAULT_DB, TaskSpec
from replicator.pipeline.selection import WILDCARD, Selection, selection_matches
from server.errors import BadRequestError
from server.tasks.requests import (
    BufferConfig,
    ChannelInfo,
    CollectionInfo,
    CreateRequest,
    DialConfig,
    ExtraInfo,
    KafkaConnectParam,
    KafkaSasl,
    MilvusConnectParam,
    NameMapping,
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_CHANNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}")


def validate_create(req: CreateRequest, settings: CdcSettings) -> TaskSpec:
    """Check a create request against the settings: the task's spec, or a 400 naming the
    first problem. The spec's stored document is JSON, secrets included (the store seals them)."""
    kafka = req.kafka_connect_param
    if kafka is not None and not kafka.address and not kafka.topic:
        kafka = None  # the Go tool's clients send it empty beside milvus_connect_param
    if kafka is not None and req.milvus_connect_param is not None:
        raise BadRequestError(
            "give one target: milvus_connect_param (a Milvus) or kafka_connect_param (a Kafka "
            "topic), not both"
        )
    if kafka is not None:
        _no_kafka_option(req)
    if req.positions:
        raise BadRequestError("positions: start positions per channel are not supported")
    buffer = req.buffer_config or BufferConfig()
    if buffer.period or buffer.size:
        raise BadRequestError(
            "buffer_config: not used by this daemon (writes are batched per read of a channel, "
            "up to about 8 MB); leave it out"
        )
    if req.task_id and not _TASK_ID.fullmatch(req.task_id):
        raise BadRequestError(
            "task_id: must be 1-64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    ends = _cluster_ends(req, kafka is not None, settings)
    if req.target_cluster:
        milvus = settings.cluster(req.target_cluster).milvus
        target = {"milvus_connect_param": cluster_connect(milvus, req.target_cluster)}
    elif kafka is not None:
        target = {"kafka_connect_param": _validate_kafka(kafka)}
    else:
        target = {"milvus_connect_param": validate_connect(req.milvus_connect_param)}
    selection = _validate_selection(req, settings.maxNameLength)
    mapping = _validate_name_mapping(req.name_mapping or [], selection, settings.maxNameLength)
    channel = req.rpc_channel_info or ChannelInfo()
    channel_name = channel.name or settings.cluster(req.source_cluster).replicate_channel
    if not _CHANNEL.fullmatch(channel_name):
        raise BadRequestError(f"rpc_channel_info.name: {channel_name!r} is not a channel name")
    if channel.position:
        raise BadRequestError("rpc_channel_info.position: start positions are not supported")
    spec: dict[str, Any] = {
        **target,
        **ends,
        "rpc_channel_info": {"name": channel_name},
        "extra_info": (req.extra_info or ExtraInfo()).model_dump(),
        "buffer_config": (req.buffer_config or BufferConfig()).model_dump(),
        "name_mapping": mapping,
        "disable_auto_start": req.disable_auto_start,
    }
    if req.start_at == "end":
        spec["start_at"] = "end"
    if req.collection_infos:
        spec["collection_infos"] = _collection_list(req.collection_infos)
    else:
        spec["db_collections"] = {
            db: _collection_list(infos) for db, infos in (req.db_collections or {}).items()
        }
    if req.verify is not None:
        unreadable = source_unreadable(settings, req.source_cluster)
        if unreadable:
            raise BadRequestError(f"verify: {unreadable}")
        spec["verify"] = req.verify.model_dump(exclude_none=True)
    if req.backfill is not None:
        spec["backfill"] = {
            "collections": validate_backfill(
                req.backfill.collections, selection, settings, cluster=req.source_cluster
            )
        }
    return TaskSpec.from_stored(spec)


def cluster_connect(milvus: SourceMilvusSettings, name: str) -> dict[str, Any]:
    """A task's ``milvus_connect_param`` of the named cluster ``name``'s Milvus block (a 400
    naming the block when it is not a valid target)."""
    dial = dial_config(milvus)
    param = MilvusConnectParam(
        uri=milvus.uri,
        username=milvus.username,
        password=milvus.password,
        token=milvus.token,
        enable_tls=milvus.tls,
        dial_config=DialConfig(**dial) if dial else None,
    )
    return validate_connect(param, f"clusters.{name}.milvus")


def source_unreadable(settings: CdcSettings, cluster: str | None = None) -> str:
    """Why the daemon cannot read a task's source Milvus (its ``source_cluster``); "" when it
    can."""
    key = f"clusters.{cluster}" if cluster and cluster != DEFAULT_SOURCE else DEFAULT_SOURCE
    try:
        source = settings.cluster(cluster)
    except KeyError as exc:
        return str(exc.args[0])
    if not source.milvus.uri:
        return (
            f"the daemon cannot read the source Milvus: set {key}.milvus.uri in its configuration"
        )
    return ""


def backfill_unavailable(settings: CdcSettings, cluster: str | None = None) -> str:
    """Why the daemon cannot run a backfill of a task reading ``cluster``; "" when it can."""
    unreadable = source_unreadable(settings, cluster)
    if unreadable:
        return unreadable
    if importlib.util.find_spec("pyspark") is None:
        return (
            "needs the Python package 'pyspark' on the daemon's machine "
            "(pip install 'milvus-cdc-py[backfill]')"
        )
    return ""


def validate_backfill(
    names: list[str],
    selection: Selection,
    settings: CdcSettings,
    where: str = "backfill",
    cluster: str | None = None,
) -> list[str]:
    """The collections a backfill names: '*' (all the task selects) or names the task selects,
    ``coll`` in the default database or ``db.coll``."""
    missing = backfill_unavailable(settings, cluster)
    if missing:
        raise BadRequestError(f"{where}: {missing}")
    return _selected_names(names, selection, settings, f"{where}.collections")


def validate_verify(
    names: list[str],
    selection: Selection,
    settings: CdcSettings,
    cluster: str | None = None,
) -> list[str]:
    """The collections a verify names, as for a backfill; the source must be readable."""
    unreadable = source_unreadable(settings, cluster)
    if unreadable:
        raise BadRequestError(f"collections: {unreadable}")
    return _selected_names(names, selection, settings, "collections")


def _selected_names(
    names: list[str], selection: Selection, settings: CdcSettings, where: str
) -> list[str]:
    """'*' alone, or names the task selects: ``coll`` in the default database or ``db.coll``."""
    if not names:
        raise BadRequestError(f"{where}: empty; give ['*'] or collection names")
    if WILDCARD in names and len(names) > 1:
        raise BadRequestError(f"{where}: '*' names every selected collection; give it alone")
    if len(set(names)) != len(names):
        raise BadRequestError(f"{where}: a collection is named twice")
    for i, name in enumerate(names):
        if name == WILDCARD:
            continue
        db, _, collection = name.rpartition(".")
        db = db or DEFAULT_DB
        _check_name(db, f"{where}[{i}]", settings.maxNameLength)
        _check_name(collection, f"{where}[{i}]", settings.maxNameLength)
        if not selection_matches(selection, db, collection):
            raise BadRequestError(f"{where}[{i}]: {name!r} is not selected by the task")
    return list(names)


def _collection_list(infos: list[CollectionInfo]) -> list[dict[str, Any]]:
    return [{"name": i.name, "use_start_position": i.use_start_position} for i in infos]


_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_BROKER = re.compile(r"[A-Za-z0-9._-]+:[0-9]{1,5}")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


def _no_kafka_option(req: CreateRequest) -> None:
    """What a Kafka target cannot do, refused by name."""
    if req.backfill is not None:
        raise BadRequestError(
            "backfill: a Kafka target takes no backfill (events start where the task starts)"
        )
    if req.verify is not None:
        raise BadRequestError("verify: a Kafka target cannot be verified against the source")
    if req.extra_info is not None and req.extra_info.enable_user_role:
        raise BadRequestError(
            "extra_info.enable_user_role: users and roles are not sent to a Kafka target"
        )


def _validate_kafka(param: KafkaConnectParam) -> dict[str, Any]:
    where = "kafka_connect_param"
    brokers = [b.strip() for b in param.address.split(",")]
    if not param.address or not all(_BROKER.fullmatch(b) for b in brokers):
        raise BadRequestError(
            f"{where}.address: {param.address!r} is not a list of brokers like host:9092[,...]"
        )
    templated = "{" in param.topic
    for name, topic in (
        ("topic", param.topic),
        ("ddl_topic", param.ddl_topic),
        ("positions_topic", param.positions_topic),
    ):
        if not topic and name != "topic":
            continue
        concrete = topic.replace("{db}", "db").replace("{collection}", "collection")
        if not _TOPIC.fullmatch(concrete) or (name != "topic" and concrete != topic):
            placeholders = " ({db} and {collection} may be used)" if name == "topic" else ""
            raise BadRequestError(
                f"{where}.{name}: {topic!r} is not a Kafka topic name: 1-249 letters, digits, "
                f"'.', '_' or '-'{placeholders}"
            )
    if templated and not param.ddl_topic:
        raise BadRequestError(
            f"{where}.ddl_topic: required when topic has placeholders (database events belong "
            "to no collection)"
        )
    connect: dict[str, Any] = {
        "address": ",".join(brokers),
        "topic": param.topic,
        "enable_sasl": param.enable_sasl,
        "connect_timeout": param.connect_timeout or DEFAULT_CONNECT_TIMEOUT,
    }
    if param.ddl_topic:
        connect["ddl_topic"] = param.ddl_topic
    if param.positions_topic:
        connect["positions_topic"] = param.positions_topic
    if param.max_event_bytes:
        connect["max_event_bytes"] = param.max_event_bytes
    if param.processes:
        connect["processes"] = param.processes
    if param.enable_sasl:
        sasl = param.sasl or KafkaSasl()
        password = sasl.password.get_secret_value()
        if not sasl.username or not password:
            raise BadRequestError(f"{where}.sasl: enable_sasl needs a username and a password")
        if sasl.mechanism and sasl.mechanisms and sasl.mechanism != sasl.mechanisms:
            raise BadRequestError(f"{where}.sasl: mechanism and mechanisms disagree")
        mechanism = (sasl.mechanism or sasl.mechanisms or "PLAIN").upper()
        if mechanism not in SASL_MECHANISMS:
            raise BadRequestError(
                f"{where}.sasl.mechanism: {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        protocol = (sasl.security_protocol or "SASL_PLAINTEXT").upper()
        if protocol not in SASL_PROTOCOLS:
            raise BadRequestError(
                f"{where}.sasl.security_protocol: {protocol!r} is not one of "
                f"{', '.join(SASL_PROTOCOLS)}"
            )
        connect["sasl"] = {
            "username": sasl.username,
            "password": password,
            "mechanism": mechanism,
            "security_protocol": protocol,
        }
    return connect


def _cluster_ends(req: CreateRequest, kafka: bool, settings: CdcSettings) -> dict[str, str]:
    """The named ends of a task (``source_cluster``, ``target_cluster``) as the spec stores
    them: a named source only when it is not sourceConfig."""
    ends: dict[str, str] = {}
    for where, name in (
        ("source_cluster", req.source_cluster),
        ("target_cluster", req.target_cluster),
    ):
        if name is None:
            continue
        try:
            settings.cluster(name)
        except KeyError as exc:
            raise BadRequestError(f"{where}: {exc.args[0]}") from None
        if name and name != DEFAULT_SOURCE:
            ends[where] = name
    if req.target_cluster is None:
        return ends
    if kafka or req.milvus_connect_param is not None:
        raise BadRequestError(
            "give one target: target_cluster, milvus_connect_param or kafka_connect_param"
        )
    source = req.source_cluster or DEFAULT_SOURCE
    if (req.target_cluster or DEFAULT_SOURCE) == source:
        raise BadRequestError(f"target_cluster: {source!r} is the task's source as well")
    if "target_cluster" not in ends:
        raise BadRequestError(
            f"target_cluster: {DEFAULT_SOURCE!r} has no Milvus endpoint to write to; name one of "
            "the configuration's clusters"
        )
    if not settings.cluster(req.target_cluster).milvus.uri:
        raise BadRequestError(
            f"target_cluster: clusters.{req.target_cluster}.milvus.uri is not set in the "
            "daemon's configuration"
        )
    return ends


def validate_connect(
    param: MilvusConnectParam | None, where: str = "milvus_connect_param"
) -> dict[str, Any]:
    if param is None:
        raise BadRequestError(f"{where}: required (the target Milvus)")
    if param.uri and param.host:
        raise BadRequestError(f"{where}: give either uri or host and port, not both")
    if param.uri:
        parts = urlsplit(param.uri)
        try:
            valid = parts.scheme in ("http", "https", "tcp", "grpc") and bool(parts.hostname)
            valid = valid and (parts.port is None or parts.port > 0)
        except ValueError:  # a port that is not a number
            valid = False
        if not valid:
            raise BadRequestError(
                f"{where}.uri: {param.uri!r} is not a Milvus address like http://host:19530"
            )
    elif not param.host:
        raise BadRequestError(f"{where}: give uri, or host and port")
    elif param.port <= 0:
        raise BadRequestError(f"{where}.port: must be between 1 and 65535")
    if bool(param.username) != bool(param.password.get_secret_value()):
        raise BadRequestError(f"{where}: give both username and password, or neither")
    if param.token.get_secret_value() and param.username:
        raise BadRequestError(f"{where}: give either token or username and password, not both")
    dial = param.dial_config or DialConfig()
    for name in ("server_pem_path", "ca_pem_path", "client_pem_path", "client_key_path"):
        path = getattr(dial, name)
        if path and not Path(path).is_file():
            raise BadRequestError(f"{where}.dial_config.{name}: no readable file at {path}")
    two_way = [dial.ca_pem_path, dial.client_pem_path, dial.client_key_path]
    if any(two_way) and not all(two_way):
        raise BadRequestError(
            f"{where}.dial_config: two-way TLS needs ca_pem_path, client_pem_path and "
            "client_key_path together"
        )
    tls = param.enable_tls or urlsplit(param.uri or "").scheme == "https"
    if (dial.server_pem_path or any(two_way)) and not tls:
        raise BadRequestError(
            f"{where}.dial_config: certificate paths need enable_tls: true (or an https:// uri)"
        )
    if param.channel_num:
        raise BadRequestError(
            f"{where}.channel_num: not used by this daemon (each source channel is written by "
            "a worker of its own); leave it out or 0"
        )
    data = param.model_dump()
    data["password"] = param.password.get_secret_value()
    data["token"] = param.token.get_secret_value()
    data["dial_config"] = dial.model_dump()
    data["connect_timeout"] = param.connect_timeout or DEFAULT_CONNECT_TIMEOUT
    return data


def _check_name(name: str, where: str, max_length: int) -> None:
    if len(name) > max_length:
        raise BadRequestError(f"{where}: {name[:40]!r}... is longer than {max_length} characters")
    if not _NAME.fullmatch(name):
        raise BadRequestError(
            f"{where}: {name!r} is not a valid name (letters, digits and '_', not starting "
            "with a digit)"
        )


def _check_collections(infos: list[CollectionInfo], where: str, max_length: int) -> set[str]:
    if not infos:
        raise BadRequestError(f"{where}: empty; name at least one collection or '*'")
    names = [info.name for info in infos]
    if WILDCARD in names and len(names) > 1:
        raise BadRequestError(f"{where}: '*' selects every collection and must stand alone")
    if len(set(names)) != len(names):
        raise BadRequestError(f"{where}: a collection is named twice")
    for i, info in enumerate(infos):
        if info.positions:
            raise BadRequestError(f"{where}[{i}].positions: start positions are not supported")
        if info.name != WILDCARD:
            _check_name(info.name, f"{where}[{i}].name", max_length)
    return set(names)


def _validate_selection(req: CreateRequest, max_length: int) -> set[tuple[str, str]]:
    if req.collection_infos and req.db_collections:
        raise BadRequestError("give either collection_infos or db_collections, not both")
    if req.collection_infos:
        names = _check_collections(req.collection_infos, "collection_infos", max_length)
        return {(DEFAULT_DB, name) for name in names}
    if not req.db_collections:
        raise BadRequestError("collection_infos or db_collections: required, e.g. [{'name': '*'}]")
    selection = set()
    for db, infos in req.db_collections.items():
        where = f"db_collections.{db}"
        if db != WILDCARD:
            _check_name(db, "db_collections: database name", max_length)
        selection |= {(db, name) for name in _check_collections(infos, where, max_length)}
    return selection


def _validate_name_mapping(
    mappings: list[NameMapping], selection: Selection, max_length: int
) -> list[dict[str, Any]]:
    seen: set[str] = set()
    result = []
    for i, mapping in enumerate(mappings):
        where = f"name_mapping[{i}]"
        _check_name(mapping.source_db, f"{where}.source_db", max_length)
        _check_name(mapping.target_db, f"{where}.target_db", max_length)
        if mapping.source_db in seen:
            raise BadRequestError(f"{where}.source_db: {mapping.source_db!r} is mapped twice")
        seen.add(mapping.source_db)
        collections = mapping.collection_mapping or {}
        for source, target in collections.items():
            _check_name(source, f"{where}.collection_mapping", max_length)
            _check_name(target, f"{where}.collection_mapping.{source}", max_length)
            if not selection_matches(selection, mapping.source_db, source):
                raise BadRequestError(
                    f"{where}.collection_mapping: {mapping.source_db}.{source} is not selected "
                    "by the task"
                )
        result.append(
            {
                "source_db": mapping.source_db,
                "target_db": mapping.target_db,
                "collection_mapping": dict(collections),
            }
        )
    return result
