"""Writing to a target Milvus through its public gRPC API (the ``MilvusService`` stubs that
pymilvus ships), so any Milvus 2.3-2.6 or Milvus Lite works without changing its settings.

DML goes as the source's column data: an Insert's ``fields_data`` become the target's
``InsertRequest``/``UpsertRequest`` without visiting a row. Collections are created from the
source's schema (system fields dropped, ``autoID`` off so the source's keys are kept).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc, schema_pb2

from replicator.sinks.base import SinkError, TargetRejectedError, TargetUnavailableError

log = logging.getLogger(__name__)

_SYSTEM_FIELD_IDS = (0, 1)  # RowID, Timestamp
_RETRIABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}
_MAX_MESSAGE = 512 * 1024 * 1024
DELETE_CHUNK = 5000


def target_address(connect: dict[str, Any]) -> tuple[str, bool]:
    if connect.get("uri"):
        parts = urlsplit(connect["uri"])
        secure = parts.scheme == "https" or bool(connect.get("enable_tls"))
        return (
            f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 19530)}",
            secure,
        )
    return f"{connect['host']}:{connect['port']}", bool(connect.get("enable_tls"))


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def target_schema(source: schema_pb2.CollectionSchema) -> schema_pb2.CollectionSchema:
    """The source schema as a target can create it: user fields only, keys given by us."""
    schema = schema_pb2.CollectionSchema()
    schema.CopyFrom(source)
    del schema.fields[:]
    schema.autoID = False
    for field in source.fields:
        if field.fieldID in _SYSTEM_FIELD_IDS and field.name in ("RowID", "Timestamp"):
            continue
        if field.is_dynamic:  # "$meta" is implied by enable_dynamic_field
            continue
        copy = schema.fields.add()
        copy.CopyFrom(field)
        copy.autoID = False
    return schema


def pk_field(schema: schema_pb2.CollectionSchema) -> schema_pb2.FieldSchema:
    for field in schema.fields:
        if field.is_primary_key:
            return field
    raise TargetRejectedError(f"collection {schema.name} has no primary key field")


def has_partition_key(schema: schema_pb2.CollectionSchema) -> bool:
    return any(field.is_partition_key for field in schema.fields)


class MilvusTarget:
    """One connection to a target Milvus; blocking calls, used from worker threads."""

    def __init__(self, connect: dict[str, Any], timeout: float = 60.0) -> None:
        address, secure = target_address(connect)
        self.address = address
        self._timeout = timeout
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ]
        if secure:
            dial = connect.get("dial_config") or {}
            if dial.get("server_name"):
                options.append(("grpc.ssl_target_name_override", dial["server_name"]))
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(dial.get("ca_pem_path") or dial.get("server_pem_path", "")),
                private_key=_read(dial.get("client_key_path", "")),
                certificate_chain=_read(dial.get("client_pem_path", "")),
            )
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = milvus_pb2_grpc.MilvusServiceStub(self._channel)
        self._metadata: list[tuple[str, str]] = []
        if connect.get("token"):
            self._metadata.append(
                ("authorization", base64.b64encode(connect["token"].encode()).decode())
            )
        elif connect.get("username"):
            pair = f"{connect['username']}:{connect['password']}".encode()
            self._metadata.append(("authorization", base64.b64encode(pair).decode()))

    def close(self) -> None:
        self._channel.close()

    # --- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, request: Any, what: str) -> Any:
        try:
            response = getattr(self._stub, method)(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            message = f"{what} on {self.address}: {code}: {details}"
            if code in _RETRIABLE_CODES:
                raise TargetUnavailableError(message) from None
            raise TargetRejectedError(message) from None
        status = response if method in _STATUS_ONLY else getattr(response, "status", None)
        if status is not None and (status.code != 0 or status.error_code != 0):
            raise TargetRejectedError(f"{what} on {self.address}: {status.reason or status.code}")
        return response

    # --- DDL ---------------------------------------------------------------------------------
    def has_collection(self, db: str, name: str) -> bool:
        response = self._call(
            "HasCollection",
            milvus_pb2.HasCollectionRequest(db_name=db, collection_name=name),
            f"has collection {db}.{name}",
        )
        return bool(response.value)

    def create_collection(
        self,
        db: str,
        name: str,
        source_schema: schema_pb2.CollectionSchema,
        shards: int,
        consistency_level: int = 0,
    ) -> bool:
        """Create unless it exists (with its database); True when created."""
        self.ensure_database(db)
        if self.has_collection(db, name):
            return False
        schema = target_schema(source_schema)
        schema.name = name
        self._call(
            "CreateCollection",
            milvus_pb2.CreateCollectionRequest(
                db_name=db,
                collection_name=name,
                schema=schema.SerializeToString(),
                shards_num=max(1, shards),
                consistency_level=consistency_level,
            ),
            f"create collection {db}.{name}",
        )
        return True

    def ensure_database(self, db: str) -> None:
        """Databases come from the replicate channel, collections from the DML channels, in no
        order between them: a collection's database is made when it is missing."""
        if not db or db == "default":
            return
        response = self._call("ListDatabases", milvus_pb2.ListDatabasesRequest(), "list databases")
        if db in response.db_names:
            return
        try:
            self._call(
                "CreateDatabase",
                milvus_pb2.CreateDatabaseRequest(db_name=db),
                f"create database {db}",
            )
        except TargetRejectedError as exc:
            if "exist" not in str(exc).lower():
                raise

    def drop_collection(self, db: str, name: str) -> bool:
        """Drop with its aliases (Milvus 2.4+ refuses to drop a collection that has any)."""
        if not self.has_collection(db, name):
            return False
        for alias in self.aliases_of(db, name):
            self.drop_alias(db, alias)
        self._call(
            "DropCollection",
            milvus_pb2.DropCollectionRequest(db_name=db, collection_name=name),
            f"drop collection {db}.{name}",
        )
        return True

    def has_partition(self, db: str, collection: str, partition: str) -> bool:
        response = self._call(
            "HasPartition",
            milvus_pb2.HasPartitionRequest(
                db_name=db, collection_name=collection, partition_name=partition
            ),
            f"has partition {db}.{collection}.{partition}",
        )
        return bool(response.value)

    def create_partition(self, db: str, collection: str, partition: str) -> None:
        if not self.has_partition(db, collection, partition):
            self._call(
                "CreatePartition",
                milvus_pb2.CreatePartitionRequest(
                    db_name=db, collection_name=collection, partition_name=partition
                ),
                f"create partition {db}.{collection}.{partition}",
            )

    def call(self, method: str, request: Any, what: str) -> Any:
        """Any MilvusService call with a request the caller built (the replicate channel's)."""
        return self._call(method, request, what)

    def drop_partition(self, db: str, collection: str, partition: str) -> bool:
        """Release, then drop (Milvus refuses to drop a loaded partition); False if absent."""
        if not self.has_partition(db, collection, partition):
            return False
        try:
            self._call(
                "ReleasePartitions",
                milvus_pb2.ReleasePartitionsRequest(
                    db_name=db, collection_name=collection, partition_names=[partition]
                ),
                f"release partition {db}.{collection}.{partition}",
            )
        except TargetRejectedError as exc:
            if not is_unimplemented(exc):
                raise  # Milvus Lite has no partition load state: nothing to release there
        self._call(
            "DropPartition",
            milvus_pb2.DropPartitionRequest(
                db_name=db, collection_name=collection, partition_name=partition
            ),
            f"drop partition {db}.{collection}.{partition}",
        )
        return True

    # --- aliases -----------------------------------------------------------------------------
    def aliases_of(self, db: str, collection: str) -> list[str]:
        # ListAliases, not DescribeCollection.aliases: Milvus Lite leaves the latter empty
        response = self._call(
            "ListAliases",
            milvus_pb2.ListAliasesRequest(db_name=db, collection_name=collection),
            f"list aliases of {db}.{collection}",
        )
        return list(response.aliases)

    def create_alias(self, db: str, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection``, creating it or moving it from another collection."""
        request = {"db_name": db, "collection_name": collection, "alias": alias}
        what = f"alias {db}.{alias} -> {collection}"
        try:
            self._call("CreateAlias", milvus_pb2.CreateAliasRequest(**request), f"create {what}")
        except TargetRejectedError:
            self._call("AlterAlias", milvus_pb2.AlterAliasRequest(**request), f"alter {what}")

    def drop_alias(self, db: str, alias: str) -> None:
        self._call(
            "DropAlias",
            milvus_pb2.DropAliasRequest(db_name=db, alias=alias),
            f"drop alias {db}.{alias}",
        )

    # --- DML ---------------------------------------------------------------------------------
    def insert(
        self,
        db: str,
        collection: str,
        partition: str,
        fields_data: Sequence[schema_pb2.FieldData],
        num_rows: int,
        *,
        upsert: bool = False,
    ) -> None:
        request_type = milvus_pb2.UpsertRequest if upsert else milvus_pb2.InsertRequest
        request = request_type(
            db_name=db,
            collection_name=collection,
            partition_name=partition,
            fields_data=fields_data,
            num_rows=num_rows,
        )
        self._call(
            "Upsert" if upsert else "Insert",
            request,
            f"{'upsert' if upsert else 'insert'} {num_rows} rows into {db}.{collection}",
        )

    def delete(
        self, db: str, collection: str, partition: str, pk_name: str, keys: Iterable[int | str]
    ) -> None:
        keys = list(keys)
        for start in range(0, len(keys), DELETE_CHUNK):
            chunk = keys[start : start + DELETE_CHUNK]
            expr = f"{pk_name} in {json.dumps(chunk, ensure_ascii=False)}"
            self._call(
                "Delete",
                milvus_pb2.DeleteRequest(
                    db_name=db, collection_name=collection, partition_name=partition, expr=expr
                ),
                f"delete {len(chunk)} rows from {db}.{collection}",
            )


def is_unimplemented(exc: SinkError) -> bool:
    """The target does not offer the call at all (Milvus Lite: partition load and release)."""
    return "UNIMPLEMENTED" in str(exc)


_STATUS_ONLY = {
    "CreateCollection",
    "DropCollection",
    "CreatePartition",
    "CreateIndex",
    "DropIndex",
    "AlterIndex",
    "LoadCollection",
    "ReleaseCollection",
    "LoadPartitions",
    "ReleasePartitions",
    "DropPartition",
    "CreateDatabase",
    "DropDatabase",
    "CreateAlias",
    "AlterAlias",
    "DropAlias",
}

__all__ = ["MilvusTarget", "SinkError", "pk_field", "target_schema"]
