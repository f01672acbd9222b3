"""The target's DDL calls beyond what the 2.3-2.5 pipeline needs: databases, collections
altered, renamed, given fields and functions, indexes, load state (the 2.6 streaming DDL of
``replicator/pipeline/stream_ddl.py``). Thin calls: idempotency is the caller's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from replicator.errors import Rejection, TargetRejectedError
from replicator.sinks.milvus_connection import TargetConnection
from replicator.sinks.target_capabilities import require_holdable

KeyValues = Sequence[tuple[str, str]]


def as_pairs(pairs: KeyValues) -> list[common_pb2.KeyValuePair]:
    return [common_pb2.KeyValuePair(key=k, value=v) for k, v in pairs]


class TargetDdl(TargetConnection):
    """Databases, collections, fields, functions, indexes and load state on a target."""

    def create_database(self, db: str, properties: KeyValues = ()) -> None:
        self._call(
            "CreateDatabase",
            milvus_pb2.CreateDatabaseRequest(db_name=db, properties=as_pairs(properties)),
            f"create database {db}",
        )

    def alter_database(self, db: str, properties: KeyValues, delete_keys: Sequence[str]) -> None:
        self._call(
            "AlterDatabase",
            milvus_pb2.AlterDatabaseRequest(
                db_name=db, properties=as_pairs(properties), delete_keys=list(delete_keys)
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
                properties=as_pairs(properties),
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
                extra_params=as_pairs(params),
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
                extra_params=as_pairs(params),
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
