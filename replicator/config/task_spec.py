"""A task's settings as one typed, frozen value: what every part of the daemon reads of a task.

A create request is validated once (server/tasks/spec.py ``validate_create``) into a
:class:`TaskSpec`; a stored task is read back with :meth:`TaskSpec.of` (or
:meth:`TaskSpec.from_stored`). :meth:`TaskSpec.to_stored` is the JSON document the metastores
keep, the same document every earlier release stored (the Go tool's field names), so records of
every release read alike. Keys a later release adds are kept as they are and written back
unchanged.

The stored document, for reference::

    milvus_connect_param   the target Milvus (uri or host/port, credentials, TLS, connect_timeout)
    kafka_connect_param    or the target Kafka topic (address, topic, sasl, connect_timeout)
    source_cluster         the named source (absent: sourceConfig)
    target_cluster         the named target (absent: an address)
    rpc_channel_info       {"name": the source's replicate channel}
    collection_infos       [{"name": ...}] in the default database, or
    db_collections         {db: [{"name": ...}]}
    name_mapping           [{"source_db", "target_db", "collection_mapping"}]
    extra_info             {"enable_user_role": bool}
    buffer_config          {"period": 0, "size": 0} (accepted, unused)
    disable_auto_start     bool
    start_at               "end" (absent: where the source's channels are now)
    verify                 {"every": ..., "sample": ...} scheduled verifies
    backfill               {"collections": [...]} asked at create
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import urlsplit

from replicator.config.release import RELEASE

# the name a task's source_cluster takes for the daemon's sourceConfig
DEFAULT_SOURCE = "sourceConfig"
DEFAULT_DB = "default"
DEFAULT_CONNECT_TIMEOUT = 10  # seconds, when a stored target names none
KAFKA_PARAM = "kafka_connect_param"
MILVUS_PARAM = "milvus_connect_param"

Selection = frozenset[tuple[str, str]]


class UnreadableSpecError(ValueError):
    """A stored spec this release cannot read (a newer release's, or damaged)."""


_SECRET_KEYS = frozenset({"password", "token"})


def stored_secrets(stored: Any) -> list[str]:
    """The clear secrets anywhere in a stored document (its ``password`` and ``token``
    values), for the log redactor when the document does not read as a spec."""
    if isinstance(stored, Mapping):
        found = []
        for key, value in stored.items():
            if key in _SECRET_KEYS and isinstance(value, str) and value:
                found.append(value)
            else:
                found.extend(stored_secrets(value))
        return found
    if isinstance(stored, list | tuple):
        return [secret for item in stored for secret in stored_secrets(item)]
    return []


def without_secrets(stored: Any) -> Any:
    """A stored document with every ``password`` and ``token`` left out (a view of a spec
    that does not read as one)."""
    if isinstance(stored, Mapping):
        return {k: without_secrets(v) for k, v in stored.items() if k not in _SECRET_KEYS}
    if isinstance(stored, list | tuple):
        return [without_secrets(item) for item in stored]
    return stored


def spec_problem(task: StoredTask) -> str:
    """Why this release can neither read nor run a stored task ("" when it can do both)."""
    try:
        return TaskSpec.of(task).unrunnable_reason()
    except UnreadableSpecError as exc:
        return str(exc)


class StoredTask(Protocol):
    """What :meth:`TaskSpec.of` reads of a task record."""

    @property
    def spec(self) -> Mapping[str, Any]: ...


def _frozen(value: Any) -> Any:
    """A read-only copy of a JSON value (mappings become read-only, lists tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


def _thawed(value: Any) -> Any:
    """The JSON value of a :func:`_frozen` one."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thawed(item) for item in value]
    return value


def target_identity(connect: Mapping[str, Any]) -> tuple[str, int]:
    """A Milvus target comparable across ``uri`` and ``host``/``port`` spellings."""
    if connect.get("uri"):
        parts = urlsplit(connect["uri"])
        default = 443 if parts.scheme == "https" else 19530
        return (parts.hostname or "").lower(), parts.port or default
    return str(connect["host"]).lower(), int(connect["port"])


@dataclass(frozen=True)
class TaskSpec:
    """A task's validated settings; build with :meth:`from_stored` or :meth:`of`."""

    milvus_connect_param: Mapping[str, Any] | None
    kafka_connect_param: Mapping[str, Any] | None
    source_cluster: str | None  # None: the daemon's sourceConfig
    target_cluster: str | None  # None: the target is an address, not a named cluster
    rpc_channel: str  # the source's replicate channel ("" in records from before it was kept)
    selection: Selection  # (database, collection) pairs; '*' is a wildcard in either
    name_mapping: tuple[Mapping[str, Any], ...]
    disable_auto_start: bool
    start_at_end: bool
    rbac: bool  # extra_info.enable_user_role: users and roles are replicated (2.6 sources)
    verify: Mapping[str, Any] | None  # scheduled verifies (``every``, ``sample``)
    backfill_collections: tuple[str, ...] | None  # a backfill asked at create
    document: Mapping[str, Any] = field(repr=False)  # the stored document, read-only

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> TaskSpec:
        """The spec of a stored document (also one written by an earlier release);
        ``UnreadableSpecError`` naming what does not parse (one a newer release wrote, say)."""
        try:
            return cls._parse(stored)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise UnreadableSpecError(
                f"its stored spec cannot be read by release {RELEASE}: {type(exc).__name__}: {what}"
            ) from exc

    @classmethod
    def _parse(cls, stored: Mapping[str, Any]) -> TaskSpec:
        if stored.get("collection_infos"):
            pairs = {(DEFAULT_DB, info["name"]) for info in stored["collection_infos"]}
        else:
            pairs = {
                (db, info["name"])
                for db, infos in (stored.get("db_collections") or {}).items()
                for info in infos
            }
        backfill = stored.get("backfill")
        frozen = _frozen(stored)
        return cls(
            milvus_connect_param=frozen.get(MILVUS_PARAM) or None,
            kafka_connect_param=frozen.get(KAFKA_PARAM) or None,
            source_cluster=stored.get("source_cluster") or None,
            target_cluster=stored.get("target_cluster") or None,
            rpc_channel=str((stored.get("rpc_channel_info") or {}).get("name") or ""),
            selection=frozenset(pairs),
            name_mapping=tuple(frozen.get("name_mapping") or ()),
            disable_auto_start=bool(stored.get("disable_auto_start")),
            start_at_end=stored.get("start_at") == "end",
            rbac=bool((stored.get("extra_info") or {}).get("enable_user_role")),
            verify=frozen.get("verify") or None,
            backfill_collections=tuple(backfill["collections"]) if backfill else None,
            document=frozen,
        )

    @classmethod
    def of(cls, task: StoredTask) -> TaskSpec:
        """The spec of a task record."""
        return cls.from_stored(task.spec)

    def to_stored(self) -> dict[str, Any]:
        """The JSON document the metastores keep (secrets included: the store seals them)."""
        return dict(_thawed(self.document))

    def unrunnable_reason(self) -> str:
        """Why this release cannot run the task ("" when it can): a target of a kind it does
        not know (a newer release's), which it leaves alone rather than fail."""
        if self.milvus_connect_param or self.kafka_connect_param:
            return ""
        known = {MILVUS_PARAM, KAFKA_PARAM}
        other = sorted(k for k in self.document if k.endswith("_connect_param") and k not in known)
        named = f" ({', '.join(other)})" if other else ""
        return (
            f"its spec names no target release {RELEASE} knows{named}: it writes to "
            f"{MILVUS_PARAM} or {KAFKA_PARAM}"
        )

    # --- the target --------------------------------------------------------------------------
    @property
    def is_kafka(self) -> bool:
        """The task writes to a Kafka topic, not to a Milvus."""
        return bool(self.kafka_connect_param)

    @property
    def target_param(self) -> dict[str, Any]:
        """The target's connection settings (a Kafka topic's or a Milvus's), as a new dict."""
        param = self.kafka_connect_param if self.is_kafka else self.milvus_connect_param
        return dict(_thawed(param or {}))

    @property
    def connect_timeout(self) -> float:
        """The task's ``connect_timeout`` (its target's, 10 s when left out): the daemon waits
        that long at most for anything it must reach to answer a request about the task."""
        param = self.kafka_connect_param or self.milvus_connect_param or {}
        return float(param.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT)

    def target_key(self) -> tuple[str, ...]:
        """What the task writes to, comparable between tasks: a Milvus (host, port) or a Kafka
        cluster's first broker and the topic."""
        kafka = self.kafka_connect_param
        if kafka:
            return "kafka", str(kafka["address"]).split(",")[0].lower(), str(kafka["topic"])
        host, port = target_identity(self.milvus_connect_param or {})
        return "milvus", host, str(port)

    def target_label(self) -> str:
        """The target as logs and views name it: ``host:port`` or ``kafka://brokers/topic``."""
        kafka = self.kafka_connect_param
        if kafka:
            return f"kafka://{kafka['address']}/{kafka['topic']}"
        host, port = target_identity(self.milvus_connect_param or {})
        return f"{host}:{port}"

    # --- the source --------------------------------------------------------------------------
    @property
    def source_name(self) -> str:
        """The source cluster's name (``sourceConfig`` for the daemon's own)."""
        return self.source_cluster or DEFAULT_SOURCE

    # --- secrets and views -------------------------------------------------------------------
    def secrets(self) -> list[str]:
        """The clear secrets of the spec, for the log redactor (a sealed one is a mapping)."""
        connect = self.milvus_connect_param or {}
        sasl = (self.kafka_connect_param or {}).get("sasl") or {}
        found = [connect.get("password"), connect.get("token"), sasl.get("password")]
        return [s for s in found if isinstance(s, str)]

    def public_view(self) -> dict[str, Any]:
        """The stored document as responses show it: no password, no token, wherever they are
        (also in a target kind this release does not know)."""
        view: dict[str, Any] = without_secrets(self.document)
        return view
        connect = dict(view.get(MILVUS_PARAM) or {})
        connect.pop("password", None)
        connect.pop("token", None)
        view[MILVUS_PARAM] = connect
        return view
