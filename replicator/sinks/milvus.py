"""Writing to a target Milvus through its public gRPC API (the ``MilvusService`` stubs that
pymilvus ships), so any Milvus 2.3-2.6 or Milvus Lite works without changing its settings.

DML goes as the source's column data: an Insert's ``fields_data`` become the target's
``InsertRequest``/``UpsertRequest`` without visiting a row, except a Geometry column, which a
2.6 WAL holds as WKB and a target's insert takes as WKT (:mod:`wkb`). Collections are created
from the source's schema (system fields dropped, ``autoID`` off so the source's keys are kept)
only when the target can hold every type and feature of the schema (decided from its version
before anything is made there, :mod:`target_capabilities`), then described: a target that
kept less of the schema than the source has stops the task before any row is written there
(:mod:`schema_check`, the second line).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
from pymilvus.grpc_gen import common_pb2, milvus_pb2, milvus_pb2_grpc, schema_pb2

from metastore.fenced import Fence
from metastore.tls_files import TlsFiles
from replicator.codec.wkb import WkbError, geometry_columns_as_wkt
from replicator.errors import Rejection, SinkError, TargetRejectedError, TaskFailedError
from replicator.sinks.column_merge import merge_columns
from replicator.sinks.milvus_channel import (
    auth_metadata,
    open_channel,
    target_address,
    tls_paths,
)
from replicator.sinks.milvus_rbac import TargetRbac
from replicator.sinks.milvus_status import call_failure, checked_reply
from replicator.sinks.schema_check import dropped_clustering_keys, require_fields
from replicator.sinks.schema_convert import has_partition_key, target_schema
from replicator.sinks.target_capabilities import Target, require_holdable, target_of

log = logging.getLogger(__name__)


def _log_warning(text: str) -> None:
    log.warning("%s", text)


DELETE_CHUNK = 5000


class MilvusTarget:
    """One connection to a target Milvus; blocking calls, used from worker threads."""

    def __init__(self, connect: dict[str, Any], timeout: float = 60.0) -> None:
        address, secure = target_address(connect)
        self.address = address
        self._connect = connect
        self._timeout = timeout
        self._secure = secure
        # its TLS files, read again when they change (a rotation: metastore/tls_files.py)
        self._files = TlsFiles(*(tls_paths(connect) if secure else ()))
        mark = self._files.mark()
        self._channel = open_channel(address, secure, connect)
        self._files.accept(mark)
        self._stub = milvus_pb2_grpc.MilvusServiceStub(self._channel)
        # set by a task's runner: no call once it is closed, and none outlasting its lease
        self.fence: Fence | None = None
        # a note for the operator: a task's runner sets its warnings (progress.warnings)
        self.warn: Callable[[str], None] = _log_warning
        self._metadata = auth_metadata(connect)

    def close(self) -> None:
        self._channel.close()

    def _reopen_if_rotated(self) -> None:
        """A new channel when the TLS files changed since this one was made (a target serves
        one thread: no call is under way on the old one, which is closed). Files that cannot
        be read yet (half-written) leave the old channel in use until the next check."""
        mark = self._files.changed()
        if mark is None:
            return
        try:
            channel = open_channel(self.address, self._secure, self._connect)
        except OSError as exc:
            log.warning("target %s: its TLS files changed, unreadable: %s", self.address, exc)
            return
        old, self._channel = self._channel, channel
        self._stub = milvus_pb2_grpc.MilvusServiceStub(channel)
        self._files.accept(mark)
        old.close()
        log.info("target %s: its TLS files changed; reconnected with them", self.address)

    def sibling(self) -> MilvusTarget:
        """A connection of its own to the same target (for another thread of the task)."""
        return MilvusTarget(self._connect, self._timeout)

    # --- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, request: Any, what: str) -> Any:
        """One call; a failure is classified here, once (see :mod:`milvus_status`). A fenced
        target (a task's runner) makes no call once its fence is closed, and bounds each by
        the time the fence has left."""
        timeout = self._timeout
        if self.fence is not None:
            self.fence.check()
            timeout = min(timeout, self.fence.remaining())
        self._reopen_if_rotated()
        try:
            response = getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise call_failure(exc, what, self.address) from None
        return checked_reply(method, response, what, self.address)

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
        properties: KeyValues = (),
        num_partitions: int = 0,
    ) -> bool:
        """Create unless it exists (with its database); True when created.
        ``num_partitions``: a partition-key collection's partitions on the source (0: the
        target's default, 64 on 2.3-2.5; a source made with num_partitions=4 keeps 4)."""
        self.ensure_database(db)
        if self.has_collection(db, name):
            self._require_fields(db, name, source_schema)
            return False
        require_holdable(f"{db}.{name}", source_schema, self.target())
        schema = target_schema(source_schema)
        schema.name = name
        keyed = has_partition_key(source_schema) and num_partitions > 0
        self._call(
            "CreateCollection",
            milvus_pb2.CreateCollectionRequest(
                db_name=db,
                collection_name=name,
                schema=schema.SerializeToString(),
                shards_num=max(1, shards),
                consistency_level=consistency_level,
                properties=_pairs(properties),
                num_partitions=num_partitions if keyed else 0,
            ),
            f"create collection {db}.{name}",
        )
        self._require_fields(db, name, source_schema)
        return True

    def target(self) -> Target:
        """What this target is (a Milvus of a version, Milvus Lite), asked before every DDL that
        depends on it (a collection created, a field or a function added: what it can hold is
        decided from it, :mod:`target_capabilities`). Never kept: the channel reconnects by
        itself, and a server replaced or downgraded behind the same address answers then (a
        version kept from the first connection let a 2.3 target receive what it cannot hold);
        a DDL is rare, one more call costs nothing."""
        response = self._call("GetVersion", milvus_pb2.GetVersionRequest(), "get version")
        return target_of(str(response.version))

    def _require_fields(self, db: str, name: str, source: schema_pb2.CollectionSchema) -> None:
        """The collection on the target holds every field of ``source``, or the task stops
        before a row is written there (:mod:`schema_check`)."""
        described = self.describe_collection(db, name)
        require_fields(f"{db}.{name}", source, described.schema)
        for field in dropped_clustering_keys(source, described.schema):
            self.warn(
                f"collection {db}.{name}: the target keeps no clustering key for field {field} "
                "(it made the field without it); the rows are exact, but the target's "
                "clustering compaction will not use the field"
            )

    def flush(self, db: str, collections: Sequence[str]) -> None:
        self._call(
            "Flush",
            milvus_pb2.FlushRequest(db_name=db, collection_names=list(collections)),
            f"flush {db}.{','.join(collections)}",
        )

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
            if exc.rejection is not Rejection.ALREADY_EXISTS:
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
            if exc.rejection is not Rejection.UNIMPLEMENTED:
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

    # --- 2.6 DDL (replicator/pipeline/stream_ddl.py): thin calls, idempotency is the caller's -
    def create_database(self, db: str, properties: KeyValues = ()) -> None:
        self._call(
            "CreateDatabase",
            milvus_pb2.CreateDatabaseRequest(db_name=db, properties=_pairs(properties)),
            f"create database {db}",
        )

    def alter_database(self, db: str, properties: KeyValues, delete_keys: Sequence[str]) -> None:
        self._call(
            "AlterDatabase",
            milvus_pb2.AlterDatabaseRequest(
                db_name=db, properties=_pairs(properties), delete_keys=list(delete_keys)
            ),
            f"alter database {db}",
        )

    def describe_database(self, db: str) -> dict[str, str]:
        response = self._call(
            "DescribeDatabase",
            milvus_pb2.DescribeDatabaseRequest(db_name=db),
            f"describe database {db}",
        )
        return {p.key: p.value for p in response.properties}

    def list_databases(self) -> list[str]:
        response = self._call("ListDatabases", milvus_pb2.ListDatabasesRequest(), "list databases")
        return list(response.db_names)

    def drop_database(self, db: str) -> None:
        self._call(
            "DropDatabase", milvus_pb2.DropDatabaseRequest(db_name=db), f"drop database {db}"
        )

    def list_collections(self, db: str) -> list[str]:
        response = self._call(
            "ShowCollections",
            milvus_pb2.ShowCollectionsRequest(db_name=db),
            f"list collections of {db}",
        )
        return list(response.collection_names)

    def describe_collection(self, db: str, name: str) -> Any:
        """The target's ``DescribeCollectionResponse`` (schema, properties, shards, ...)."""
        return self._call(
            "DescribeCollection",
            milvus_pb2.DescribeCollectionRequest(db_name=db, collection_name=name),
            f"describe collection {db}.{name}",
        )

    def alter_collection(
        self, db: str, name: str, properties: KeyValues, delete_keys: Sequence[str] = ()
    ) -> None:
        self._call(
            "AlterCollection",
            milvus_pb2.AlterCollectionRequest(
                db_name=db,
                collection_name=name,
                properties=_pairs(properties),
                delete_keys=list(delete_keys),
            ),
            f"alter collection {db}.{name}",
        )

    def rename_collection(self, db: str, name: str, new_db: str, new_name: str) -> None:
        self._call(
            "RenameCollection",
            milvus_pb2.RenameCollectionRequest(
                db_name=db, oldName=name, newDBName=new_db, newName=new_name
            ),
            f"rename collection {db}.{name} to {new_db}.{new_name}",
        )

    def add_collection_field(self, db: str, name: str, field: schema_pb2.FieldSchema) -> None:
        """Add ``field``, once the target's version says it holds its type and features."""
        held = schema_pb2.CollectionSchema(fields=[field])
        require_holdable(f"{db}.{name}", held, self.target(), f"field {field.name} is not added")
        self._call(
            "AddCollectionField",
            milvus_pb2.AddCollectionFieldRequest(
                db_name=db, collection_name=name, schema=field.SerializeToString()
            ),
            f"add field {field.name} to {db}.{name}",
        )

    def add_collection_function(
        self, db: str, name: str, function: schema_pb2.FunctionSchema
    ) -> None:
        """Add ``function`` (BM25, text embedding) to the collection, once the target's version
        says it holds the function's kind (Milvus 2.6 offers AddCollectionFunction)."""
        held = schema_pb2.CollectionSchema(functions=[function])
        doing = f"function {function.name} is not added"
        require_holdable(f"{db}.{name}", held, self.target(), doing)
        self._call(
            "AddCollectionFunction",
            milvus_pb2.AddCollectionFunctionRequest(
                db_name=db, collection_name=name, functionSchema=function
            ),
            f"add function {function.name} to {db}.{name}",
        )

    def truncate_collection(self, db: str, name: str) -> None:
        self._call(
            "TruncateCollection",
            milvus_pb2.TruncateCollectionRequest(db_name=db, collection_name=name),
            f"truncate collection {db}.{name}",
        )

    def describe_indexes(self, db: str, collection: str) -> list[Any]:
        """The collection's ``IndexDescription``s; [] when it has none."""
        try:
            response = self._call(
                "DescribeIndex",
                milvus_pb2.DescribeIndexRequest(db_name=db, collection_name=collection),
                f"describe indexes of {db}.{collection}",
            )
        except TargetRejectedError as exc:
            if exc.rejection is Rejection.NOT_FOUND:
                return []  # "index not found" (Milvus), "no index on collection" (Lite)
            raise
        return list(response.index_descriptions)

    def create_index(
        self, db: str, collection: str, field: str, name: str, params: KeyValues
    ) -> None:
        self._call(
            "CreateIndex",
            milvus_pb2.CreateIndexRequest(
                db_name=db,
                collection_name=collection,
                field_name=field,
                index_name=name,
                extra_params=_pairs(params),
            ),
            f"create index {name} on {db}.{collection}.{field}",
        )

    def alter_index(
        self, db: str, collection: str, name: str, params: KeyValues, delete_keys: Sequence[str]
    ) -> None:
        self._call(
            "AlterIndex",
            milvus_pb2.AlterIndexRequest(
                db_name=db,
                collection_name=collection,
                index_name=name,
                extra_params=_pairs(params),
                delete_keys=list(delete_keys),
            ),
            f"alter index {name} of {db}.{collection}",
        )

    def drop_index(self, db: str, collection: str, field: str, name: str) -> None:
        self._call(
            "DropIndex",
            milvus_pb2.DropIndexRequest(
                db_name=db, collection_name=collection, field_name=field, index_name=name
            ),
            f"drop index {name} of {db}.{collection}",
        )

    def partitions(self, db: str, collection: str) -> list[str]:
        response = self._call(
            "ShowPartitions",
            milvus_pb2.ShowPartitionsRequest(db_name=db, collection_name=collection),
            f"list partitions of {db}.{collection}",
        )
        return list(response.partition_names)

    def load_state(self, db: str, collection: str) -> int:
        """``common_pb2.LoadState`` of the collection (NotExist=0, NotLoad=1, Loading=2,
        Loaded=3)."""
        response = self._call(
            "GetLoadState",
            milvus_pb2.GetLoadStateRequest(db_name=db, collection_name=collection),
            f"load state of {db}.{collection}",
        )
        return int(response.state)

    def load(
        self,
        db: str,
        collection: str,
        *,
        replicas: int = 1,
        partitions: Sequence[str] = (),
        load_fields: Sequence[str] = (),
    ) -> None:
        """LoadCollection, or LoadPartitions when ``partitions`` are named."""
        what = f"load {db}.{collection}"
        if partitions:
            request: Any = milvus_pb2.LoadPartitionsRequest(
                db_name=db,
                collection_name=collection,
                partition_names=list(partitions),
                replica_number=replicas,
                load_fields=list(load_fields),
            )
            self._call("LoadPartitions", request, f"{what} partitions {list(partitions)}")
            return
        request = milvus_pb2.LoadCollectionRequest(
            db_name=db,
            collection_name=collection,
            replica_number=replicas,
            load_fields=list(load_fields),
        )
        self._call("LoadCollection", request, what)

    def release(self, db: str, collection: str) -> None:
        self._call(
            "ReleaseCollection",
            milvus_pb2.ReleaseCollectionRequest(db_name=db, collection_name=collection),
            f"release {db}.{collection}",
        )

    # --- RBAC ---------------------------------------------------------------------------------
    @property
    def rbac(self) -> TargetRbac:
        """The target's users, roles, grants and privilege groups, through this connection."""
        return TargetRbac(self._call)

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
        more: Sequence[Sequence[schema_pb2.FieldData]] = (),
    ) -> None:
        """``more``: the columns of later inserts of the same rows' shape, merged column by
        column into the request's own (protobuf ``MergeFrom`` appends the values): each value
        is copied once into the request, not into columns first and then into the request."""
        request_type = milvus_pb2.UpsertRequest if upsert else milvus_pb2.InsertRequest
        request = request_type(
            db_name=db,
            collection_name=collection,
            partition_name=partition,
            fields_data=fields_data,
            num_rows=num_rows,
        )
        merge_columns(request.fields_data, more)
        what = f"{'upsert' if upsert else 'insert'} {num_rows} rows into {db}.{collection}"
        try:
            geometry_columns_as_wkt(request.fields_data, f"{db}.{collection}")
        except WkbError as exc:
            raise TaskFailedError(f"{what}: {exc}") from None
        try:
            self._call("Upsert" if upsert else "Insert", request, what)
        except TargetRejectedError as exc:
            # a target's refusal need not say of which field (2.3.5: "%!s(<nil>) is not
            # supported now" for a Geometry column): the reason names every column and type
            columns = ", ".join(
                f"{c.field_name} {schema_pb2.DataType.Name(c.type)}" for c in request.fields_data
            )
            raise TargetRejectedError(f"{exc} (columns: {columns})", exc.rejection) from None

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


KeyValues = Sequence[tuple[str, str]]


def _pairs(pairs: KeyValues) -> list[common_pb2.KeyValuePair]:
    return [common_pb2.KeyValuePair(key=k, value=v) for k, v in pairs]


__all__ = ["MilvusTarget", "SinkError"]
