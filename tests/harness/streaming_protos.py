"""The 2.6 streaming headers as real protobuf classes, built from descriptors in code, for the
test writer.

The decoder (replicator/codec/streaming_headers.py) reads these headers by hand, field by field;
the writer encodes them with the protobuf runtime from the declarations below. Two independent
implementations that agree on the bytes are the point: a wrong field number or wire type on
either side shows up as a failed round trip. Field numbers and types are those of Milvus's
``pkg/proto/messages.proto`` (our own declarations, only the messages the writer needs; package
``cdc_test.streaming`` so nothing collides with another descriptor pool entry).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _BOOL, _STRING, _BYTES, _ENUM, _MESSAGE = (
    _F.TYPE_INT64,
    _F.TYPE_UINT64,
    _F.TYPE_BOOL,
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_ENUM,
    _F.TYPE_MESSAGE,
)
_PACKAGE = "cdc_test.streaming"

# message -> [(field name, number, type, repeated, type name for messages/enums)]
_MESSAGES: dict[str, list[tuple[str, int, int, bool, str]]] = {
    "Empty": [],
    "TxnContext": [
        ("txn_id", 1, _INT64, False, ""),
        ("keepalive_milliseconds", 2, _INT64, False, ""),
    ],
    "ResourceKey": [
        ("domain", 1, _ENUM, False, "ResourceDomain"),
        ("key", 2, _STRING, False, ""),
        ("shared", 3, _BOOL, False, ""),
    ],
    "BroadcastHeader": [
        ("broadcast_id", 1, _UINT64, False, ""),
        ("vchannels", 2, _STRING, True, ""),
        ("resource_keys", 3, _MESSAGE, True, "ResourceKey"),
        ("ack_sync_up", 4, _BOOL, False, ""),
    ],
    "CipherHeader": [
        ("ez_id", 1, _INT64, False, ""),
        ("collection_id", 2, _INT64, False, ""),
        ("safe_key", 3, _BYTES, False, ""),
        ("payload_bytes", 4, _INT64, False, ""),
    ],
    "SegmentAssignment": [("segment_id", 1, _INT64, False, "")],
    "PartitionSegmentAssignment": [
        ("partition_id", 1, _INT64, False, ""),
        ("rows", 2, _UINT64, False, ""),
        ("binary_size", 3, _UINT64, False, ""),
        ("segment_assignment", 4, _MESSAGE, False, "SegmentAssignment"),
    ],
    "InsertMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("partitions", 2, _MESSAGE, True, "PartitionSegmentAssignment"),
    ],
    "DeleteMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("rows", 2, _UINT64, False, ""),
    ],
    "CreateCollectionMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("partition_ids", 2, _INT64, True, ""),
        ("db_id", 3, _INT64, False, ""),
    ],
    "DropCollectionMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("db_id", 2, _INT64, False, ""),
    ],
    "PartitionMessageHeader": [  # Create- and DropPartitionMessageHeader have the same fields
        ("collection_id", 1, _INT64, False, ""),
        ("partition_id", 2, _INT64, False, ""),
    ],
    "ManualFlushMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("flush_ts", 2, _UINT64, False, ""),
        ("segment_ids", 3, _INT64, True, ""),
    ],
    "FlushAllMessageHeader": [],  # messages.proto: no fields
    "ImportMessageHeader": [],  # messages.proto: no fields
    "BeginTxnMessageHeader": [("keepalive_milliseconds", 1, _INT64, False, "")],
    "CreateDatabaseMessageHeader": [
        ("db_name", 1, _STRING, False, ""),
        ("db_id", 2, _INT64, False, ""),
    ],
    "TruncateCollectionMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("collection_id", 2, _INT64, False, ""),
        ("segment_ids", 3, _INT64, True, ""),
    ],
    "AlterWALMessageHeader": [
        ("target_wal_name", 1, _ENUM, False, "WALName"),
        ("config", 2, _MESSAGE, True, "AlterWALMessageHeader.ConfigEntry"),
    ],
    # --- the rest of the 2.6 DDL (tests/harness/streaming_ddl_writer.py). Embedded milvus-proto
    # messages (KeyValuePair, CollectionSchema, UserEntity, GrantEntity, RBACMeta, ...) are
    # declared as bytes and filled with pymilvus's serialization: the same bytes on the wire.
    # int32 fields are declared int64: the same varint for the non-negative values used.
    "CreateDatabaseMessageBody": [("properties", 1, _BYTES, True, "")],
    "AlterLoadConfigOfAlterDatabase": [
        ("collection_ids", 1, _INT64, True, ""),
        ("replica_number", 2, _INT64, False, ""),
        ("resource_groups", 3, _STRING, True, ""),
    ],
    "AlterDatabaseMessageBody": [
        ("properties", 1, _BYTES, True, ""),
        ("alter_load_config", 2, _MESSAGE, False, "AlterLoadConfigOfAlterDatabase"),
    ],
    "AlterAliasMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("db_name", 2, _STRING, False, ""),
        ("collection_id", 3, _INT64, False, ""),
        ("collection_name", 4, _STRING, False, ""),
        ("alias", 5, _STRING, False, ""),
    ],
    "DropAliasMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("db_name", 2, _STRING, False, ""),
        ("alias", 3, _STRING, False, ""),
    ],
    "IndexInfo": [  # index_coord.proto
        ("collectionID", 1, _INT64, False, ""),
        ("fieldID", 2, _INT64, False, ""),
        ("index_name", 3, _STRING, False, ""),
        ("indexID", 4, _INT64, False, ""),
        ("type_params", 5, _BYTES, True, ""),
        ("index_params", 6, _BYTES, True, ""),
        ("is_auto_index", 11, _BOOL, False, ""),
        ("user_index_params", 12, _BYTES, True, ""),
    ],
    "FieldIndex": [
        ("index_info", 1, _MESSAGE, False, "IndexInfo"),
        ("deleted", 2, _BOOL, False, ""),
        ("create_time", 3, _UINT64, False, ""),
    ],
    "CreateIndexMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("collection_id", 2, _INT64, False, ""),
        ("field_id", 3, _INT64, False, ""),
        ("index_id", 4, _INT64, False, ""),
        ("index_name", 5, _STRING, False, ""),
    ],
    "CreateIndexMessageBody": [("field_index", 1, _MESSAGE, False, "FieldIndex")],
    "IndexIdsMessageHeader": [  # Alter- and DropIndexMessageHeader have the same fields
        ("collection_id", 1, _INT64, False, ""),
        ("index_ids", 2, _INT64, True, ""),
    ],
    "AlterIndexMessageBody": [("field_indexes", 1, _MESSAGE, True, "FieldIndex")],
    "LoadFieldConfig": [("field_id", 1, _INT64, False, ""), ("index_id", 2, _INT64, False, "")],
    "LoadReplicaConfig": [
        ("replica_id", 1, _INT64, False, ""),
        ("resource_group_name", 2, _STRING, False, ""),
    ],
    "AlterLoadConfigMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("collection_id", 2, _INT64, False, ""),
        ("partition_ids", 3, _INT64, True, ""),
        ("load_fields", 4, _MESSAGE, True, "LoadFieldConfig"),
        ("replicas", 5, _MESSAGE, True, "LoadReplicaConfig"),
        ("user_specified_replica_mode", 6, _BOOL, False, ""),
    ],
    "FieldMask": [("paths", 1, _STRING, True, "")],
    "AlterCollectionMessageHeader": [
        ("db_id", 1, _INT64, False, ""),
        ("collection_id", 2, _INT64, False, ""),
        ("update_mask", 3, _MESSAGE, False, "FieldMask"),
    ],
    "AlterLoadConfigOfAlterCollection": [
        ("replica_number", 1, _INT64, False, ""),
        ("resource_groups", 2, _STRING, True, ""),
    ],
    "AlterCollectionMessageUpdates": [
        ("db_id", 1, _INT64, False, ""),
        ("db_name", 2, _STRING, False, ""),
        ("collection_name", 3, _STRING, False, ""),
        ("description", 4, _STRING, False, ""),
        ("schema", 5, _BYTES, False, ""),
        ("consistency_level", 6, _INT64, False, ""),
        ("properties", 7, _BYTES, True, ""),
        ("alter_load_config", 8, _MESSAGE, False, "AlterLoadConfigOfAlterCollection"),
    ],
    "AlterCollectionMessageBody": [
        ("updates", 1, _MESSAGE, False, "AlterCollectionMessageUpdates")
    ],
    "SchemaChangeMessageHeader": [
        ("collection_id", 1, _INT64, False, ""),
        ("flushed_segment_ids", 2, _INT64, True, ""),
    ],
    "SchemaChangeMessageBody": [("schema", 1, _BYTES, False, "")],
    "CredentialInfo": [  # internal.proto
        ("username", 1, _STRING, False, ""),
        ("encrypted_password", 2, _STRING, False, ""),
        ("sha256_password", 5, _STRING, False, ""),
        ("time_tick", 6, _UINT64, False, ""),
    ],
    # AlterUser{user_entity=1}, AlterRole{role_entity=1}, Alter/DropPrivilege{entity=1},
    # Alter/DropPrivilegeGroup{privilege_group_info=1}: one embedded milvus-proto message
    "EntityMessageHeader": [("entity", 1, _BYTES, False, "")],
    "AlterUserMessageBody": [("credential_info", 1, _MESSAGE, False, "CredentialInfo")],
    "NameMessageHeader": [  # DropUser{user_name=1}, DropRole{role_name=1, force_drop=2}
        ("role_name", 1, _STRING, False, ""),
        ("force_drop", 2, _BOOL, False, ""),
    ],
    "RoleBinding": [
        ("user_entity", 1, _BYTES, False, ""),
        ("role_entity", 2, _BYTES, False, ""),
    ],
    "UserRoleMessageHeader": [("role_binding", 1, _MESSAGE, False, "RoleBinding")],
    "RestoreRBACMessageBody": [("rbac_meta", 1, _BYTES, False, "")],
}

_ENUMS = {
    "WALName": [("Unknown", 0), ("RocksMQ", 1), ("Pulsar", 2), ("Kafka", 3), ("WoodPecker", 4)],
    "ResourceDomain": [
        ("ResourceDomainUnknown", 0),
        ("ResourceDomainCollectionName", 2),
        ("ResourceDomainDBName", 3),
        ("ResourceDomainCluster", 127),
    ],
}


Declaration = list[tuple[str, int, int, bool, str]]


def _field(package: str, name: str, number: int, kind: int, repeated: bool, type_name: str) -> _F:
    field = _F(
        name=name,
        number=number,
        type=kind,
        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
    )
    if type_name:
        field.type_name = f".{package}.{type_name}"
    return field


def build_classes(
    package: str,
    messages: dict[str, Declaration],
    enums: dict[str, list[tuple[str, int]]],
    map_entries: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Message classes for ``messages`` (``[(field, number, type, repeated, type name)]``) in a
    descriptor pool of their own. ``map_entries`` ``{message: entry}`` declares the nested
    ``<message>.<entry>`` a repeated field of that type needs to be a ``map<string, string>``."""
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '_')}.proto", package=package, syntax="proto3"
    )
    for enum_name, values in enums.items():
        enum = file.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for message_name, fields in messages.items():
        message = file.message_type.add(name=message_name)
        message.field.extend(_field(package, *f) for f in fields)
        entry_name = (map_entries or {}).get(message_name)
        if entry_name:
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            entry.field.extend(
                [
                    _field(package, "key", 1, _STRING, False, ""),
                    _field(package, "value", 2, _STRING, False, ""),
                ]
            )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in messages
    }


MESSAGES: dict[str, Any] = build_classes(
    _PACKAGE, _MESSAGES, _ENUMS, {"AlterWALMessageHeader": "ConfigEntry"}
)
WAL_NAME = {"rocksmq": 1, "pulsar": 2, "kafka": 3, "woodpecker": 4}


def header(name: str, **fields: Any) -> bytes:
    """The serialized header ``name`` with ``fields`` set (sub-messages as dicts)."""
    message = MESSAGES[name]()
    for key, value in fields.items():
        if isinstance(value, dict) and key != "config":
            getattr(message, key).CopyFrom(MESSAGES[_sub_type(name, key)](**value))
        elif isinstance(value, dict):
            getattr(message, key).update(value)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                getattr(message, key).add(**_nested(name, key, item))
        elif isinstance(value, list):
            getattr(message, key).extend(value)
        else:
            setattr(message, key, value)
    return bytes(message.SerializeToString())


def _sub_type(message: str, field: str) -> str:
    for name, _number, _kind, _repeated, type_name in _MESSAGES[message]:
        if name == field:
            return type_name
    raise KeyError(f"{message}.{field}")


def _nested(message: str, field: str, item: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for one repeated sub-message (its own sub-messages built too)."""
    sub = _sub_type(message, field)
    out: dict[str, Any] = {}
    for key, value in item.items():
        out[key] = MESSAGES[_sub_type(sub, key)](**value) if isinstance(value, dict) else value
    return out
