"""The 2.6 DDL a replica applies, decoded from a :class:`StreamDdl` (header and body bytes) into
small typed operations: databases, aliases, indexes, load configuration, alter/truncate
collection, schema changes and RBAC.

Every operation says when it may be applied (:attr:`DdlOp.barrier`):

- **first copy** (creates and alters): at the first copy of the broadcast that is read;
- **barrier** (drops, truncate, release): only after every vchannel of ``_bh.vchannels`` has
  been read past its copy, so data written before the drop on a slower channel still lands.

The decoders are our own, wire-compatible with Milvus's ``pkg/proto/messages.proto`` (read at
milvus-io/milvus commit 003b114b9ebdebca01713e80142d216845822b27) and read with
:mod:`replicator.codec.wire`; milvus-proto messages embedded in them (``common.KeyValuePair``,
``schema.CollectionSchema``, ``milvus.UserEntity``/``RoleEntity``/``GrantEntity``/
``PrivilegeGroupInfo``/``RBACMeta``) are parsed with the classes pymilvus ships. Field numbers:

- ``Create/Alter/DropDatabaseMessageHeader{db_name=1, db_id=2}``; ``CreateDatabaseMessageBody
  {properties=1}``; ``AlterDatabaseMessageBody{properties=1, alter_load_config=2
  (AlterLoadConfigOfAlterDatabase{collection_ids=1, replica_number=2, resource_groups=3})}``.
- ``AlterAliasMessageHeader{db_id=1, db_name=2, collection_id=3, collection_name=4, alias=5}``;
  ``DropAliasMessageHeader{db_id=1, db_name=2, alias=3}``.
- ``CreateIndexMessageHeader{db_id=1, collection_id=2, field_id=3, index_id=4, index_name=5}``,
  body ``{field_index=1}``; ``AlterIndexMessageHeader{collection_id=1, index_ids=2}``, body
  ``{field_indexes=1}``; ``DropIndexMessageHeader{collection_id=1, index_ids=2}`` (empty = every
  index of the collection). The index itself is ``index.FieldIndex{index_info=1, deleted=2,
  create_time=3}`` with ``IndexInfo{collectionID=1, fieldID=2, index_name=3, indexID=4,
  type_params=5, index_params=6, ..., is_auto_index=11, user_index_params=12}``
  (``pkg/proto/index_coord.proto``, same repository).
- ``AlterLoadConfigMessageHeader{db_id=1, collection_id=2, partition_ids=3, load_fields=4
  (LoadFieldConfig{field_id=1, index_id=2}), replicas=5 (LoadReplicaConfig{replica_id=1,
  resource_group_name=2, priority=3}), user_specified_replica_mode=6}``, empty body;
  ``DropLoadConfigMessageHeader{db_id=1, collection_id=2}``. The querycoord builds the header
  from the *expected* state (``internal/querycoordv2/job/load_config.go``): ``partition_ids`` are
  every partition that is to be loaded (all of them for a collection load) and ``replicas`` has
  one entry per replica; both are sent to the control channel only.
- ``AlterCollectionMessageHeader{db_id=1, collection_id=2, update_mask=3
  (google.protobuf.FieldMask{paths=1}), cache_expirations=4, flushed_segment_ids=5}``; body
  ``{updates=1 (AlterCollectionMessageUpdates{db_id=1, db_name=2, collection_name=3,
  description=4, schema=5, consistency_level=6, properties=7, alter_load_config=8
  (AlterLoadConfigOfAlterCollection{replica_number=1, resource_groups=2})})}``. Rootcoord
  (``internal/rootcoord/ddl_callbacks_alter_collection_*.go``) sends the *whole* new property
  set (not a delta) and, for a schema change, the whole new schema; it broadcasts to the control
  channel and every vchannel of the collection. The mask's path strings are constants
  (``message.FieldMaskCollectionProperties`` ...) whose values we could not read in the indexed
  sources, so a path is matched by the words it contains (see :func:`_mask_parts`).
- ``SchemaChangeMessageHeader{collection_id=1, flushed_segment_ids=2}``, body ``{schema=1}``
  (deprecated in favour of AlterCollection; still read).
- ``TruncateCollectionMessageHeader{db_id=1, collection_id=2, segment_ids=3}``.
- RBAC, all on the control channel (``internal/rootcoord/ddl_callbacks_rbac_*.go``):
  ``AlterUserMessageHeader{user_entity=1}``, body ``{credential_info=1}``;
  ``DropUser{user_name=1}``; ``AlterRole{role_entity=1}``; ``DropRole{role_name=1,
  force_drop=2}``; ``Alter/DropUserRole{role_binding=1 (RoleBinding{user_entity=1,
  role_entity=2})}``; ``Alter/DropPrivilege{entity=1 (milvus.GrantEntity)}``;
  ``Alter/DropPrivilegeGroup{privilege_group_info=1}``;
  ``RestoreRBACMessageBody{rbac_meta=1 (milvus.RBACMeta)}``.
- **Credentials.** ``internal.CredentialInfo{username=1, encrypted_password=2, tenant=3,
  is_super=4, sha256_password=5, time_tick=6, description=7}`` (``pkg/proto/internal.proto``;
  the proxy bcrypt-hashes the password before rootcoord broadcasts it, see
  ``internal/rootcoord/ddl_callbacks_rbac_credential.go``). The WAL therefore never holds the
  password itself, and a public-API target accepts only a password. :class:`AlterUser` keeps
  the user name and *whether* a hash was present, never the hash, so no log line can carry it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError
from pymilvus.grpc_gen import common_pb2, milvus_pb2, msg_pb2, schema_pb2

from replicator.codec.streaming_ddl_ops import (
    AlterAlias,
    AlterCollection,
    AlterDatabase,
    AlterIndex,
    AlterRole,
    AlterUser,
    CreateDatabase,
    CreateIndex,
    DdlOp,
    DropAlias,
    DropDatabase,
    DropIndex,
    DropRole,
    DropUser,
    ImportJob,
    IndexSpec,
    KeyValues,
    LoadConfig,
    NotReplicated,
    Privilege,
    PrivilegeGroup,
    ReleaseCollection,
    RestoreRBAC,
    TruncateCollection,
    UserRole,
)
from replicator.codec.streaming_events import StreamDdl
from replicator.codec.streaming_headers import Header
from replicator.codec.wire import WireError


class DdlDecodeError(WireError):
    """A 2.6 DDL whose header or body cannot be read; the message names the type. (Malformed
    protobuf raises the codec's :class:`PropertyError`, also a :class:`WireError`, naming the
    type's header or body.)"""


# --- a small reader over one protobuf message ---------------------------------------------------


class _Msg(Header):
    """A header or body read by field number (:class:`Header`, plus what DDL bodies need)."""

    def __init__(self, buf: bytes, what: str) -> None:
        super().__init__(what, buf)
        self._what = what

    def flag(self, number: int) -> bool:
        return self.uint64(number) != 0

    def int64s(self, number: int) -> tuple[int, ...]:
        return self.int64_list(number)

    def raw(self, number: int) -> list[bytes]:
        return [v for n, _w, v in self._fields if n == number and isinstance(v, bytes)]

    def texts(self, number: int) -> tuple[str, ...]:
        return tuple(self._decode_text(number, v) for v in self.raw(number))

    def sub(self, number: int) -> _Msg:
        """The last sub-message ``number`` (an empty one when absent)."""
        values = self.raw(number)
        return _Msg(values[-1] if values else b"", f"{self._what}.{number}")

    def subs(self, number: int) -> list[_Msg]:
        return [_Msg(v, f"{self._what}.{number}") for v in self.raw(number)]

    def has(self, number: int) -> bool:
        return any(n == number for n, _w, _v in self._fields)

    def pb(self, number: int, cls: Any) -> Any:
        """Sub-message ``number`` parsed with a milvus-proto class (None when absent)."""
        values = self.raw(number)
        if not values:
            return None
        return _parse(cls, values[-1], f"{self._what}.{number}")

    def key_values(self, number: int) -> KeyValues:
        pairs = [_parse(common_pb2.KeyValuePair, v, self._what) for v in self.raw(number)]
        return tuple((p.key, p.value) for p in pairs)


def _parse(cls: Any, buf: bytes, what: str) -> Any:
    try:
        return cls.FromString(buf)
    except (DecodeError, ValueError) as exc:
        raise DdlDecodeError(f"{what}: not a {cls.__name__} ({exc})") from None


def decode_ddl(event: StreamDdl) -> DdlOp:
    """The operation of one DDL copy; :class:`DdlDecodeError` when its bytes cannot be read."""
    decoder = _DECODERS.get(event.type_name)
    base: dict[str, Any] = {
        "type_name": event.type_name,
        "ts": event.ts,
        "broadcast_id": event.meta.broadcast.broadcast_id if event.meta.broadcast else 0,
        "db_id": event.db_id,
        "db_name": event.db_name,
        "collection_id": event.collection_id,
        "collection_name": event.collection_name,
    }
    if event.type_name == "Import":
        return _import(base, event.body)
    if decoder is None:
        return NotReplicated(**base, reason=f"{event.type_name} is not replicated")
    header = _Msg(event.header, f"{event.type_name} header")
    op: DdlOp = decoder(base, header, _Msg(event.body, f"{event.type_name} body"))
    return op


def _import(base: dict[str, Any], body: bytes) -> DdlOp:
    try:
        request = msg_pb2.ImportMsg.FromString(body)
    except DecodeError as exc:
        raise DdlDecodeError(f"Import body: {exc}") from exc
    return ImportJob(
        **{
            **base,
            "db_name": request.db_name or base["db_name"],
            "collection_id": request.collectionID or base["collection_id"],
            "collection_name": request.collection_name or base["collection_name"],
        },
        job_id=request.jobID,
        partition_ids=tuple(request.partitionIDs),
        files=tuple(tuple(f.paths) for f in request.files),
    )


def _create_database(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return CreateDatabase(**_db(base, header), properties=body.key_values(1))


def _alter_database(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    load = body.sub(2)
    return AlterDatabase(
        **_db(base, header),
        properties=body.key_values(1),
        load_collection_ids=load.int64s(1),
        replica_number=load.int64(2),
        resource_groups=load.texts(3),
    )


def _drop_database(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return DropDatabase(**_db(base, header))


def _db(base: dict[str, Any], header: _Msg) -> dict[str, Any]:
    return {**base, "db_name": header.text(1), "db_id": header.int64(2)}


def _alter_alias(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    fields = {
        "db_id": header.int64(1),
        "db_name": header.text(2),
        "collection_id": header.int64(3),
        "collection_name": header.text(4),
    }
    return AlterAlias(**{**base, **fields}, alias=_required(header.text(5), "alias", base))


def _drop_alias(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    fields = {"db_id": header.int64(1), "db_name": header.text(2)}
    return DropAlias(**{**base, **fields}, alias=_required(header.text(3), "alias", base))


def _index_spec(field_index: _Msg) -> IndexSpec:
    info = field_index.sub(1)  # FieldIndex.index_info
    return IndexSpec(
        index_id=info.int64(4),
        index_name=info.text(3),
        field_id=info.int64(2),
        type_params=info.key_values(5),
        index_params=info.key_values(6),
        is_auto_index=info.flag(11),
        user_index_params=info.key_values(12),
    )


def _create_index(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    spec = _index_spec(body.sub(1))
    # the header is authoritative for the ids and name; the body adds the params
    spec = IndexSpec(
        index_id=header.int64(4) or spec.index_id,
        index_name=header.text(5) or spec.index_name,
        field_id=header.int64(3) or spec.field_id,
        index_params=spec.index_params,
        user_index_params=spec.user_index_params,
        type_params=spec.type_params,
        is_auto_index=spec.is_auto_index,
    )
    fields = {"db_id": header.int64(1), "collection_id": header.int64(2)}
    return CreateIndex(**{**base, **fields}, index=spec)


def _alter_index(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    indexes = tuple(_index_spec(fi) for fi in body.subs(1))
    return AlterIndex(**{**base, "collection_id": header.int64(1)}, indexes=indexes)


def _drop_index(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return DropIndex(**{**base, "collection_id": header.int64(1)}, index_ids=header.int64s(2))


def _alter_load_config(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    replicas = header.subs(5)
    groups = tuple(dict.fromkeys(r.text(2) for r in replicas if r.text(2)))
    return LoadConfig(
        **{**base, "db_id": header.int64(1), "collection_id": header.int64(2)},
        partition_ids=header.int64s(3),
        load_field_ids=tuple(f.int64(1) for f in header.subs(4)),
        replica_number=max(1, len(replicas)),
        resource_groups=groups,
    )


def _drop_load_config(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return ReleaseCollection(**{**base, "db_id": header.int64(1), "collection_id": header.int64(2)})


def _mask_parts(paths: Iterable[str]) -> frozenset[str]:
    """What an AlterCollection update mask changes. Matched by words, since the constants'
    exact strings were not readable (module docstring): "consistency" before "name" etc."""
    parts = set()
    for path in paths:
        p = path.lower()
        if "consistency" in p:
            parts.add("consistency")
        elif "propert" in p:
            parts.add("properties")
        elif "description" in p:
            parts.add("description")
        elif "schema" in p:
            parts.add("schema")
        elif "load" in p:
            parts.add("load")
        elif "db" in p or "database" in p:
            parts.add("db")
        elif "name" in p:
            parts.add("name")
    return frozenset(parts)


def _alter_collection(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    paths = header.sub(3).texts(1)
    updates = body.sub(1)
    changes = set(_mask_parts(paths))
    load = updates.sub(8)
    if updates.has(8):
        changes.add("load")
    return AlterCollection(
        **{**base, "db_id": header.int64(1), "collection_id": header.int64(2)},
        changes=frozenset(changes),
        mask_paths=paths,
        new_db_name=updates.text(2),
        new_name=updates.text(3),
        description=updates.text(4),
        consistency_level=updates.int64(6),
        properties=updates.key_values(7),
        schema=updates.pb(5, schema_pb2.CollectionSchema),
        replica_number=load.int64(1),
        resource_groups=load.texts(2),
    )


def _schema_change(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    schema = body.pb(1, schema_pb2.CollectionSchema)
    if schema is None:
        raise DdlDecodeError(f"{base['type_name']} body without a schema")
    return AlterCollection(
        **{**base, "collection_id": header.int64(1)},
        changes=frozenset({"schema"}),
        schema=schema,
    )


def _truncate(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return TruncateCollection(
        **{**base, "db_id": header.int64(1), "collection_id": header.int64(2)}
    )


def _alter_user(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    credential = body.sub(1)  # internal.CredentialInfo
    user = header.sub(1).text(1) or credential.text(1)  # UserEntity.name / username
    description = credential.text(7) if credential.has(7) else None
    return AlterUser(
        **base,
        user=_required(user, "user name", base),
        had_password_hash=bool(credential.raw(2)),
        description=description,
    )


def _drop_user(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return DropUser(**base, user=_required(header.text(1), "user name", base))


def _alter_role(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    role = header.sub(1)  # milvus.RoleEntity{name=1, description=2}
    return AlterRole(
        **base, role=_required(role.text(1), "role name", base), description=role.text(2)
    )


def _drop_role(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    return DropRole(**base, role=_required(header.text(1), "role name", base), force=header.flag(2))


def _user_role(grant: bool) -> Any:
    def decode(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
        binding = header.sub(1)  # RoleBinding{user_entity=1, role_entity=2}
        return UserRole(
            **base,
            user=_required(binding.sub(1).text(1), "user name", base),
            role=_required(binding.sub(2).text(1), "role name", base),
            grant=grant,
        )

    return decode


def _privilege(grant: bool) -> Any:
    def decode(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
        entity = header.pb(1, milvus_pb2.GrantEntity)
        if entity is None:
            raise DdlDecodeError(f"{base['type_name']} header without a grant entity")
        return Privilege(**base, entity=entity, grant=grant)

    return decode


def _privilege_group(drop: bool) -> Any:
    def decode(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
        info = header.pb(1, milvus_pb2.PrivilegeGroupInfo)
        if info is None or not info.group_name:
            raise DdlDecodeError(f"{base['type_name']} header without a privilege group")
        return PrivilegeGroup(
            **base,
            group=info.group_name,
            privileges=tuple(p.name for p in info.privileges),
            drop=drop,
            barrier=drop and not info.privileges,
        )

    return decode


def _restore_rbac(base: dict[str, Any], header: _Msg, body: _Msg) -> DdlOp:
    meta = body.pb(1, milvus_pb2.RBACMeta)
    return RestoreRBAC(**base, meta=meta if meta is not None else milvus_pb2.RBACMeta())


def _required(value: str, what: str, base: dict[str, Any]) -> str:
    if not value:
        raise DdlDecodeError(f"{base['type_name']} without a {what}")
    return value


_DECODERS: dict[str, Any] = {
    "CreateDatabase": _create_database,
    "AlterDatabase": _alter_database,
    "DropDatabase": _drop_database,
    "AlterAlias": _alter_alias,
    "DropAlias": _drop_alias,
    "CreateIndex": _create_index,
    "AlterIndex": _alter_index,
    "DropIndex": _drop_index,
    "AlterLoadConfig": _alter_load_config,
    "DropLoadConfig": _drop_load_config,
    "AlterCollection": _alter_collection,
    "SchemaChange": _schema_change,
    "TruncateCollection": _truncate,
    "AlterUser": _alter_user,
    "DropUser": _drop_user,
    "AlterRole": _alter_role,
    "DropRole": _drop_role,
    "AlterUserRole": _user_role(grant=True),
    "DropUserRole": _user_role(grant=False),
    "AlterPrivilege": _privilege(grant=True),
    "DropPrivilege": _privilege(grant=False),
    "AlterPrivilegeGroup": _privilege_group(drop=False),
    "DropPrivilegeGroup": _privilege_group(drop=True),
    "RestoreRBAC": _restore_rbac,
}

#: the 2.6 types :func:`decode_ddl` turns into an operation a replica applies
APPLIED_TYPES = frozenset(_DECODERS)
