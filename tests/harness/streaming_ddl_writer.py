"""Test-side writer of the 2.6 DDL that replicator/codec/streaming_ddl.py decodes: databases,
aliases, indexes, load configuration, alter/truncate collection, schema change and RBAC, each
broadcast as a 2.6 streaming node writes it (through :meth:`StreamingWriter.broadcast`: one copy
per vchannel, own ``_tt``/``_vc``, shared ``_bh``; version 2; header in ``_h``).

Headers and bodies are encoded with :func:`harness.streaming_protos.header` from the declarations
there (our own, field numbers of Milvus's ``pkg/proto/messages.proto``, ``index_coord.proto`` and
``internal.proto``; the module docstring of replicator/codec/streaming_ddl.py names the commit),
independently of the decoder's hand-written reader. Embedded milvus-proto messages are declared
as ``bytes`` and filled with the serialization of pymilvus's classes.

Where Milvus sends each one (``internal/rootcoord/ddl_callbacks_*.go``,
``internal/querycoordv2/job/load_config.go``, ``internal/datacoord`` index callbacks): database,
alias, index, load-configuration and RBAC messages to the control channel only
(``<pchannel>_vcchan``); AlterCollection to the control channel and every vchannel of the
collection; TruncateCollection and SchemaChange to the collection's vchannels (callers pass
them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from harness.streaming_protos import header
from harness.streaming_writer import StreamingWriter, Written


def kv(pairs: dict[str, str]) -> list[bytes]:
    """``repeated common.KeyValuePair`` as the serialized pairs."""
    return [common_pb2.KeyValuePair(key=k, value=v).SerializeToString() for k, v in pairs.items()]


class DdlWriter:
    """Writes the 2.6 DDL of one source cluster through a :class:`StreamingWriter`."""

    def __init__(self, writer: StreamingWriter, control_channel: str) -> None:
        self.writer = writer
        self.control = control_channel  # "<pchannel>_vcchan"

    def _control(self, msg_type: str, head: bytes, body: bytes = b"") -> Written:
        return self.writer.broadcast(
            msg_type, [self.control], header_bytes=head, body=body, version=2
        )[0]

    # --- databases ---------------------------------------------------------------------------
    def create_database(self, name: str, db_id: int, properties: dict[str, str]) -> Written:
        return self._control(
            "CreateDatabase",
            header("CreateDatabaseMessageHeader", db_name=name, db_id=db_id),
            header("CreateDatabaseMessageBody", properties=kv(properties)),
        )

    def alter_database(
        self, name: str, db_id: int, properties: dict[str, str], *, replica_number: int = 0
    ) -> Written:
        body: dict[str, Any] = {"properties": kv(properties)}
        if replica_number:
            body["alter_load_config"] = {"replica_number": replica_number}
        return self._control(
            "AlterDatabase",
            header("CreateDatabaseMessageHeader", db_name=name, db_id=db_id),
            header("AlterDatabaseMessageBody", **body),
        )

    def drop_database(self, name: str, db_id: int) -> Written:
        head = header("CreateDatabaseMessageHeader", db_name=name, db_id=db_id)
        return self._control("DropDatabase", head)

    # --- aliases -----------------------------------------------------------------------------
    def alter_alias(self, db: tuple[int, str], collection: tuple[int, str], alias: str) -> Written:
        head = header(
            "AlterAliasMessageHeader",
            db_id=db[0],
            db_name=db[1],
            collection_id=collection[0],
            collection_name=collection[1],
            alias=alias,
        )
        return self._control("AlterAlias", head)

    def drop_alias(self, db: tuple[int, str], alias: str) -> Written:
        head = header("DropAliasMessageHeader", db_id=db[0], db_name=db[1], alias=alias)
        return self._control("DropAlias", head)

    # --- indexes -----------------------------------------------------------------------------
    @staticmethod
    def field_index(
        collection_id: int,
        field_id: int,
        index_id: int,
        name: str,
        params: dict[str, str],
        user_params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """An ``index.FieldIndex`` (as the dict :func:`header` takes)."""
        info = {
            "collectionID": collection_id,
            "fieldID": field_id,
            "index_name": name,
            "indexID": index_id,
            "index_params": kv(params),
            "user_index_params": kv(user_params or {}),
            "is_auto_index": bool(user_params and user_params.get("index_type") == "AUTOINDEX"),
        }
        return {"index_info": info, "create_time": 1}

    def create_index(
        self,
        collection_id: int,
        field_id: int,
        index_id: int,
        name: str,
        params: dict[str, str],
        *,
        user_params: dict[str, str] | None = None,
        db_id: int = 1,
    ) -> Written:
        head = header(
            "CreateIndexMessageHeader",
            db_id=db_id,
            collection_id=collection_id,
            field_id=field_id,
            index_id=index_id,
            index_name=name,
        )
        fi = self.field_index(collection_id, field_id, index_id, name, params, user_params)
        return self._control("CreateIndex", head, header("CreateIndexMessageBody", field_index=fi))

    def alter_index(self, collection_id: int, field_indexes: Sequence[dict[str, Any]]) -> Written:
        ids = [fi["index_info"]["indexID"] for fi in field_indexes]
        head = header("IndexIdsMessageHeader", collection_id=collection_id, index_ids=ids)
        body = header("AlterIndexMessageBody", field_indexes=list(field_indexes))
        return self._control("AlterIndex", head, body)

    def drop_index(self, collection_id: int, index_ids: Sequence[int]) -> Written:
        head = header(
            "IndexIdsMessageHeader", collection_id=collection_id, index_ids=list(index_ids)
        )
        return self._control("DropIndex", head)

    # --- load configuration ------------------------------------------------------------------
    def load(
        self,
        collection_id: int,
        partition_ids: Sequence[int],
        *,
        replicas: int = 1,
        field_ids: Sequence[int] = (),
        db_id: int = 1,
    ) -> Written:
        """AlterLoadConfig as querycoord writes it: every partition to load, one replica
        entry per replica, load fields sorted by id."""
        head = header(
            "AlterLoadConfigMessageHeader",
            db_id=db_id,
            collection_id=collection_id,
            partition_ids=sorted(partition_ids),
            load_fields=[{"field_id": f} for f in sorted(field_ids)],
            replicas=[
                {"replica_id": 1000 + i, "resource_group_name": "__default_resource_group"}
                for i in range(replicas)
            ],
        )
        return self._control("AlterLoadConfig", head)

    def release(self, collection_id: int, *, db_id: int = 1) -> Written:
        head = header("TruncateCollectionMessageHeader", db_id=db_id, collection_id=collection_id)
        return self._control("DropLoadConfig", head)  # DropLoadConfig{db_id=1, collection_id=2}

    # --- collections -------------------------------------------------------------------------
    def alter_collection(
        self,
        collection_id: int,
        vchannels: Sequence[str],
        paths: Sequence[str],
        *,
        db_id: int = 1,
        **updates: Any,
    ) -> list[Written]:
        """AlterCollection to the control channel and ``vchannels``; ``updates`` are fields of
        AlterCollectionMessageUpdates (``properties`` as a dict, ``schema`` as a pymilvus
        CollectionSchema)."""
        if "properties" in updates:
            updates["properties"] = kv(updates["properties"])
        if "schema" in updates:
            updates["schema"] = updates["schema"].SerializeToString()
        head = header(
            "AlterCollectionMessageHeader",
            db_id=db_id,
            collection_id=collection_id,
            update_mask={"paths": list(paths)},
        )
        body = header("AlterCollectionMessageBody", updates=updates)
        return self.writer.broadcast(
            "AlterCollection", [self.control, *vchannels], header_bytes=head, body=body, version=2
        )

    def schema_change(
        self, collection_id: int, vchannels: Sequence[str], schema: schema_pb2.CollectionSchema
    ) -> list[Written]:
        head = header("SchemaChangeMessageHeader", collection_id=collection_id)
        body = header("SchemaChangeMessageBody", schema=schema.SerializeToString())
        return self.writer.broadcast(
            "SchemaChange", list(vchannels), header_bytes=head, body=body, version=2
        )

    # --- RBAC --------------------------------------------------------------------------------
    def alter_user(self, user: str, bcrypt_hash: str) -> Written:
        """AlterUser as rootcoord writes it: the credential holds the proxy's bcrypt hash."""
        entity = milvus_pb2.UserEntity(name=user).SerializeToString()
        credential = {
            "username": user,
            "encrypted_password": bcrypt_hash,
            "sha256_password": "f" * 64,
            "time_tick": 1,
        }
        body = header("AlterUserMessageBody", credential_info=credential)
        return self._control("AlterUser", header("EntityMessageHeader", entity=entity), body)

    def drop_user(self, user: str) -> Written:
        return self._control("DropUser", header("NameMessageHeader", role_name=user))

    def alter_role(self, role: str) -> Written:
        entity = milvus_pb2.RoleEntity(name=role).SerializeToString()
        return self._control("AlterRole", header("EntityMessageHeader", entity=entity))

    def drop_role(self, role: str, *, force: bool = False) -> Written:
        head = header("NameMessageHeader", role_name=role, force_drop=force)
        return self._control("DropRole", head)

    def user_role(self, user: str, role: str, *, grant: bool = True) -> Written:
        binding = {
            "user_entity": milvus_pb2.UserEntity(name=user).SerializeToString(),
            "role_entity": milvus_pb2.RoleEntity(name=role).SerializeToString(),
        }
        head = header("UserRoleMessageHeader", role_binding=binding)
        return self._control("AlterUserRole" if grant else "DropUserRole", head)

    @staticmethod
    def grant_entity(
        role: str, object_type: str, object_name: str, privilege: str, db: str = "default"
    ) -> milvus_pb2.GrantEntity:
        return milvus_pb2.GrantEntity(
            role=milvus_pb2.RoleEntity(name=role),
            object=milvus_pb2.ObjectEntity(name=object_type),
            object_name=object_name,
            db_name=db,
            grantor=milvus_pb2.GrantorEntity(
                user=milvus_pb2.UserEntity(name="root"),
                privilege=milvus_pb2.PrivilegeEntity(name=privilege),
            ),
        )

    def privilege(self, entity: milvus_pb2.GrantEntity, *, grant: bool = True) -> Written:
        head = header("EntityMessageHeader", entity=entity.SerializeToString())
        return self._control("AlterPrivilege" if grant else "DropPrivilege", head)

    def privilege_group(
        self, group: str, privileges: Sequence[str] = (), *, drop: bool = False
    ) -> Written:
        info = milvus_pb2.PrivilegeGroupInfo(
            group_name=group, privileges=[milvus_pb2.PrivilegeEntity(name=p) for p in privileges]
        )
        head = header("EntityMessageHeader", entity=info.SerializeToString())
        return self._control("DropPrivilegeGroup" if drop else "AlterPrivilegeGroup", head)

    def restore_rbac(self, meta: milvus_pb2.RBACMeta) -> Written:
        body = header("RestoreRBACMessageBody", rbac_meta=meta.SerializeToString())
        return self._control("RestoreRBAC", b"", body)
