"""The 2.6 DDL operations as the replica applies them, decoded by :mod:`streaming_ddl`."""

from __future__ import annotations

from dataclasses import dataclass, field

from pymilvus.grpc_gen import milvus_pb2, schema_pb2

KeyValues = tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class DdlOp:
    """One 2.6 DDL as the replica applies it, with the source's ids and names it carries."""

    type_name: str  # the 2.6 message type (MESSAGE_TYPES)
    ts: int  # _tt of the copy it was decoded from
    broadcast_id: int = 0
    db_id: int = 0
    db_name: str = ""  # source database name where the message names it
    collection_id: int = 0
    collection_name: str = ""

    #: applied only once every vchannel of the broadcast has been read past its copy
    barrier: bool = False
    #: an RBAC operation: applied only when the task asks for users and roles
    rbac: bool = False


@dataclass(frozen=True, kw_only=True)
class CreateDatabase(DdlOp):
    properties: KeyValues = ()


@dataclass(frozen=True, kw_only=True)
class AlterDatabase(DdlOp):
    properties: KeyValues = ()  # the database's whole new property set
    load_collection_ids: tuple[int, ...] = ()  # collections whose load config follows
    replica_number: int = 0
    resource_groups: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DropDatabase(DdlOp):
    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class AlterAlias(DdlOp):
    """Create or move ``alias`` to the collection (2.6 has one message for both)."""

    alias: str


@dataclass(frozen=True, kw_only=True)
class DropAlias(DdlOp):
    alias: str
    barrier: bool = True


@dataclass(frozen=True)
class IndexSpec:
    index_id: int
    index_name: str
    field_id: int
    index_params: KeyValues = ()  # what Milvus resolved (index_type, metric_type, params ...)
    user_index_params: KeyValues = ()  # what the user asked for (AUTOINDEX stays AUTOINDEX)
    type_params: KeyValues = ()
    is_auto_index: bool = False

    @property
    def request_params(self) -> KeyValues:
        """The params to create it with elsewhere: the user's when recorded, else resolved."""
        return self.user_index_params or self.index_params


@dataclass(frozen=True, kw_only=True)
class CreateIndex(DdlOp):
    index: IndexSpec


@dataclass(frozen=True, kw_only=True)
class AlterIndex(DdlOp):
    indexes: tuple[IndexSpec, ...] = ()  # each index's whole new state


@dataclass(frozen=True, kw_only=True)
class DropIndex(DdlOp):
    index_ids: tuple[int, ...] = ()  # empty: every index of the collection
    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class LoadConfig(DdlOp):
    """AlterLoadConfig: the collection is to be loaded like this (load or reload)."""

    partition_ids: tuple[int, ...] = ()  # every partition to be loaded
    load_field_ids: tuple[int, ...] = ()  # empty: all fields
    replica_number: int = 1
    resource_groups: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReleaseCollection(DdlOp):
    """DropLoadConfig: the collection is released."""

    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class AlterCollection(DdlOp):
    """AlterCollection (and the deprecated SchemaChange): only what ``changes`` names is set."""

    changes: frozenset[str] = frozenset()  # of: db, name, description, consistency, properties,
    #                                        schema, load (see _mask_parts)
    mask_paths: tuple[str, ...] = ()  # as written
    new_db_name: str = ""
    new_name: str = ""
    description: str = ""
    consistency_level: int = 0
    properties: KeyValues = ()  # the whole new property set
    schema: schema_pb2.CollectionSchema | None = None  # the whole new schema
    replica_number: int = 0
    resource_groups: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TruncateCollection(DdlOp):
    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class AlterUser(DdlOp):
    """Create a user or change its password. The credential in the WAL is a bcrypt hash, which
    the public API cannot take: only the name and whether one was present are kept."""

    user: str
    had_password_hash: bool = False
    description: str | None = None
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class DropUser(DdlOp):
    user: str
    rbac: bool = True
    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class AlterRole(DdlOp):
    role: str
    description: str = ""
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class DropRole(DdlOp):
    role: str
    force: bool = False
    rbac: bool = True
    barrier: bool = True


@dataclass(frozen=True, kw_only=True)
class UserRole(DdlOp):
    """AlterUserRole (``grant``) or DropUserRole: bind or unbind a user and a role."""

    user: str
    role: str
    grant: bool
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class Privilege(DdlOp):
    """AlterPrivilege (``grant``) or DropPrivilege (revoke) of one ``milvus.GrantEntity``."""

    entity: milvus_pb2.GrantEntity = field(default_factory=milvus_pb2.GrantEntity)
    grant: bool = True
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class PrivilegeGroup(DdlOp):
    """AlterPrivilegeGroup: create the group (no privileges) or add privileges to it;
    DropPrivilegeGroup: drop the group (no privileges) or remove privileges from it."""

    group: str
    privileges: tuple[str, ...] = ()
    drop: bool = False
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class RestoreRBAC(DdlOp):
    meta: milvus_pb2.RBACMeta = field(default_factory=milvus_pb2.RBACMeta)
    rbac: bool = True


@dataclass(frozen=True, kw_only=True)
class NotReplicated(DdlOp):
    """A 2.6 DDL a replica does not apply (resource groups, import, replicate configuration):
    the target's own topology is not the source's."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class ImportJob(DdlOp):
    """A bulk import the source ran (2.6 ``Import``, body msg.proto ``ImportMsg``): the rows
    it loads into the collection never pass through the WAL."""

    job_id: int
    partition_ids: tuple[int, ...] = ()
    files: tuple[tuple[str, ...], ...] = ()  # the paths of each ImportFile


# --- decoding -----------------------------------------------------------------------------------
