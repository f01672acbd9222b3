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
from collections.abc import Iterable, Sequence

from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from replicator.codec.wkb import WkbError, geometry_columns_as_wkt
from replicator.errors import Rejection, SinkError, TargetRejectedError, TaskFailedError
from replicator.sinks.column_merge import merge_columns
from replicator.sinks.milvus_ddl import KeyValues, TargetDdl, as_pairs
from replicator.sinks.milvus_rbac import TargetRbac
from replicator.sinks.schema_check import dropped_clustering_keys, require_fields
from replicator.sinks.schema_convert import has_partition_key, target_schema
from replicator.sinks.target_capabilities import require_holdable

DELETE_CHUNK = 5000


class MilvusTarget(TargetDdl):
    """One connection to a target Milvus; blocking calls, used from worker threads. Its channel
    and calls: :mod:`milvus_connection`; the 2.6 DDL calls: :mod:`milvus_ddl`."""

    def sibling(self) -> MilvusTarget:
        """A connection of its own to the same target (for another thread of the task)."""
        return MilvusTarget(self._connect, self._timeout)

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
                properties=as_pairs(properties),
                num_partitions=num_partitions if keyed else 0,
            ),
            f"create collection {db}.{name}",
        )
        self._require_fields(db, name, source_schema)
        return True

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


__all__ = ["MilvusTarget", "SinkError"]
