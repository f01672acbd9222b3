"""What a target that is not a Milvus (a Kafka topic) holds, answered as a Milvus would.

The pipeline drives every target through :class:`~replicator.sinks.milvus.MilvusTarget`'s
calls: it asks whether a collection exists before creating it, reads a schema to name an
index's field, treats "already exists" and "not found" as done. A Kafka target has no server
to ask, so it keeps this model of the databases, collections (schema, properties, partitions,
indexes, load state) and aliases its events have announced, and answers the same MilvusService
calls from it, with the same rejections. Each call that changes the model returns the change
as a :class:`Change`, which the sink turns into a DDL event.

The model is JSON (``to_json``/``from_json``): the Kafka sink commits it with the events that
changed it, so after a restart it answers exactly as before, and a DDL read again is answered
"already exists" instead of being announced twice.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from replicator.errors import Rejection, TargetRejectedError

DEFAULT_DB = "default"
DEFAULT_PARTITION = "_default"


@dataclass(frozen=True)
class Change:
    """One change of the model: a DDL event's ``op`` and what it says."""

    op: str
    db: str
    collection: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def _pairs(pairs: Any) -> dict[str, str]:
    return {p.key: p.value for p in pairs}


def _kv(values: dict[str, str]) -> list[common_pb2.KeyValuePair]:
    return [common_pb2.KeyValuePair(key=k, value=v) for k, v in sorted(values.items())]


def _missing(what: str) -> TargetRejectedError:
    return TargetRejectedError(f"{what} not found", Rejection.NOT_FOUND)


def _exists(what: str) -> TargetRejectedError:
    return TargetRejectedError(f"{what} already exists", Rejection.ALREADY_EXISTS)


class TargetModel:
    """Databases → collections and aliases, as plain JSON-able dicts:

    ``{"databases": {db: {"properties": {..}, "aliases": {alias: collection},
    "collections": {name: {"schema": b64, "shards": n, "consistency": n, "properties": {..},
    "partitions": [..], "indexes": {name: {"field": f, "params": {..}}}, "loaded": bool,
    "num_partitions": n (a partition-key collection's, when the create gave it)}}}}}``
    """

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.state: dict[str, Any] = state or {"databases": {}}
        self.state["databases"].setdefault(DEFAULT_DB, _database({}))

    # --- persistence ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return copy.deepcopy(self.state)

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> TargetModel:
        return cls(copy.deepcopy(state))

    def copy(self) -> TargetModel:
        return TargetModel(copy.deepcopy(self.state))

    # --- reads the sink needs ------------------------------------------------------------------
    def schema(self, db: str, name: str) -> schema_pb2.CollectionSchema:
        schema = schema_pb2.CollectionSchema()
        schema.ParseFromString(base64.b64decode(self._collection(db, name)["schema"]))
        return schema

    def require(self, db: str, name: str) -> None:
        """Nothing when the collection exists; NOT_FOUND, as a Milvus would answer a write."""
        self._collection(db, name)

    def has_partition(self, db: str, name: str, partition: str) -> bool:
        return partition in self._collection(db, name)["partitions"]

    # --- the MilvusService calls ---------------------------------------------------------------
    def handle(self, method: str, request: Any) -> tuple[Any, list[Change]]:
        """The answer to one call and the changes it made; raises the rejection a Milvus
        would give (``TargetRejectedError``), ``UNIMPLEMENTED`` for a call it does not model."""
        handler = getattr(self, f"_{method}", None)
        if handler is None:
            raise TargetRejectedError(
                f"{method}: not offered by a Kafka target", Rejection.UNIMPLEMENTED
            )
        result: tuple[Any, list[Change]] = handler(request)
        return result

    def _database(self, db: str) -> dict[str, Any]:
        found: dict[str, Any] | None = self.state["databases"].get(db or DEFAULT_DB)
        if found is None:
            raise _missing(f"database {db}")
        return found

    def _collection(self, db: str, name: str) -> dict[str, Any]:
        database = self._database(db)
        name = database["aliases"].get(name, name)
        found = database["collections"].get(name)
        if found is None:
            raise _missing(f"collection {db or DEFAULT_DB}.{name}")
        result: dict[str, Any] = found
        return result

    # databases
    def _ListDatabases(self, _r: Any) -> tuple[Any, list[Change]]:
        names = sorted(self.state["databases"])
        return milvus_pb2.ListDatabasesResponse(db_names=names), []

    def _CreateDatabase(self, r: Any) -> tuple[Any, list[Change]]:
        if r.db_name in self.state["databases"]:
            raise _exists(f"database {r.db_name}")
        properties = _pairs(r.properties)
        self.state["databases"][r.db_name] = _database(properties)
        return common_pb2.Status(), [
            Change("create_database", r.db_name, detail={"properties": properties})
        ]

    def _AlterDatabase(self, r: Any) -> tuple[Any, list[Change]]:
        properties = self._database(r.db_name)["properties"]
        properties.update(_pairs(r.properties))
        for key in r.delete_keys:
            properties.pop(key, None)
        detail = {"properties": dict(properties)}
        return common_pb2.Status(), [Change("alter_database", r.db_name, detail=detail)]

    def _DescribeDatabase(self, r: Any) -> tuple[Any, list[Change]]:
        properties = self._database(r.db_name)["properties"]
        return milvus_pb2.DescribeDatabaseResponse(
            db_name=r.db_name, properties=_kv(properties)
        ), []

    def _DropDatabase(self, r: Any) -> tuple[Any, list[Change]]:
        if r.db_name not in self.state["databases"]:
            raise _missing(f"database {r.db_name}")
        if self.state["databases"][r.db_name]["collections"]:
            raise TargetRejectedError(f"database {r.db_name} is not empty", Rejection.OTHER)
        del self.state["databases"][r.db_name]
        return common_pb2.Status(), [Change("drop_database", r.db_name)]

    # collections
    def _HasCollection(self, r: Any) -> tuple[Any, list[Change]]:
        database = self.state["databases"].get(r.db_name or DEFAULT_DB)
        found = database is not None and r.collection_name in database["collections"]
        return milvus_pb2.BoolResponse(value=found), []

    def _ShowCollections(self, r: Any) -> tuple[Any, list[Change]]:
        names = sorted(self._database(r.db_name)["collections"])
        return milvus_pb2.ShowCollectionsResponse(collection_names=names), []

    def _CreateCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        collections = self._database(db)["collections"]
        if r.collection_name in collections:
            raise _exists(f"collection {db}.{r.collection_name}")
        schema = schema_pb2.CollectionSchema()
        schema.ParseFromString(r.schema)
        schema.name = r.collection_name
        partitions = [DEFAULT_PARTITION]
        properties = _pairs(r.properties)
        collections[r.collection_name] = {
            "schema": base64.b64encode(schema.SerializeToString()).decode(),
            "shards": r.shards_num,
            "consistency": r.consistency_level,
            "properties": properties,
            "partitions": partitions,
            "indexes": {},
            "loaded": False,
        }
        detail = {
            "schema": schema_view(schema),
            "shards": r.shards_num,
            "consistency_level": common_pb2.ConsistencyLevel.Name(r.consistency_level),
            "properties": properties,
        }
        if r.num_partitions:  # a partition key's partitions, as the source has them
            collections[r.collection_name]["num_partitions"] = r.num_partitions
            detail["num_partitions"] = r.num_partitions
        return common_pb2.Status(), [Change("create_collection", db, r.collection_name, detail)]

    def _DescribeCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        collection = self._collection(db, r.collection_name)
        aliases = [a for a, c in self._database(db)["aliases"].items() if c == r.collection_name]
        return milvus_pb2.DescribeCollectionResponse(
            schema=self.schema(db, r.collection_name),
            collection_name=r.collection_name,
            db_name=db,
            shards_num=collection["shards"],
            consistency_level=collection["consistency"],
            properties=_kv(collection["properties"]),
            aliases=sorted(aliases),
            num_partitions=collection.get("num_partitions") or len(collection["partitions"]),
        ), []

    def _DropCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        database = self._database(db)
        if r.collection_name not in database["collections"]:
            raise _missing(f"collection {db}.{r.collection_name}")
        del database["collections"][r.collection_name]
        for alias in [a for a, c in database["aliases"].items() if c == r.collection_name]:
            del database["aliases"][alias]
        return common_pb2.Status(), [Change("drop_collection", db, r.collection_name)]

    def _AlterCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        properties = self._collection(db, r.collection_name)["properties"]
        properties.update(_pairs(r.properties))
        for key in r.delete_keys:
            properties.pop(key, None)
        detail = {"properties": dict(properties)}
        return common_pb2.Status(), [Change("alter_collection", db, r.collection_name, detail)]

    def _RenameCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        new_db = r.newDBName or db
        collection = self._collection(db, r.oldName)
        target = self._database(new_db)["collections"]
        if r.newName in target:
            raise _exists(f"collection {new_db}.{r.newName}")
        del self._database(db)["collections"][r.oldName]
        target[r.newName] = collection
        detail = {"new_db": new_db, "new_name": r.newName}
        return common_pb2.Status(), [Change("rename_collection", db, r.oldName, detail)]

    def _AddCollectionField(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        collection = self._collection(db, r.collection_name)
        schema = self.schema(db, r.collection_name)
        added = schema_pb2.FieldSchema()
        added.ParseFromString(r.schema)
        if any(f.name == added.name for f in schema.fields):
            raise _exists(f"field {added.name} of {db}.{r.collection_name}")
        if not added.fieldID:
            added.fieldID = max([f.fieldID for f in schema.fields] + [99]) + 1
        schema.fields.append(added)
        collection["schema"] = base64.b64encode(schema.SerializeToString()).decode()
        detail = {"field": field_view(added)}
        return common_pb2.Status(), [Change("add_field", db, r.collection_name, detail)]

    def _AddCollectionFunction(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        collection = self._collection(db, r.collection_name)
        schema = self.schema(db, r.collection_name)
        added = r.functionSchema
        if any(f.name == added.name for f in schema.functions):
            raise _exists(f"function {added.name} of {db}.{r.collection_name}")
        schema.functions.append(added)
        collection["schema"] = base64.b64encode(schema.SerializeToString()).decode()
        detail = {"function": function_view(added)}
        return common_pb2.Status(), [Change("add_function", db, r.collection_name, detail)]

    def _TruncateCollection(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        self._collection(db, r.collection_name)
        return common_pb2.Status(), [Change("truncate_collection", db, r.collection_name)]

    # partitions
    def _HasPartition(self, r: Any) -> tuple[Any, list[Change]]:
        found = self.has_partition(r.db_name or DEFAULT_DB, r.collection_name, r.partition_name)
        return milvus_pb2.BoolResponse(value=found), []

    def _ShowPartitions(self, r: Any) -> tuple[Any, list[Change]]:
        names = self._collection(r.db_name or DEFAULT_DB, r.collection_name)["partitions"]
        return milvus_pb2.ShowPartitionsResponse(partition_names=list(names)), []

    def _CreatePartition(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        partitions = self._collection(db, r.collection_name)["partitions"]
        if r.partition_name in partitions:
            raise _exists(f"partition {r.partition_name} of {db}.{r.collection_name}")
        partitions.append(r.partition_name)
        detail = {"partition": r.partition_name}
        return common_pb2.Status(), [Change("create_partition", db, r.collection_name, detail)]

    def _DropPartition(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        partitions = self._collection(db, r.collection_name)["partitions"]
        if r.partition_name not in partitions:
            raise _missing(f"partition {r.partition_name} of {db}.{r.collection_name}")
        partitions.remove(r.partition_name)
        detail = {"partition": r.partition_name}
        return common_pb2.Status(), [Change("drop_partition", db, r.collection_name, detail)]

    # aliases
    def _ListAliases(self, r: Any) -> tuple[Any, list[Change]]:
        aliases = self._database(r.db_name)["aliases"]
        names = [a for a, c in aliases.items() if not r.collection_name or c == r.collection_name]
        return milvus_pb2.ListAliasesResponse(aliases=sorted(names)), []

    def _CreateAlias(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        database = self._database(db)
        if r.alias in database["aliases"]:
            raise _exists(f"alias {db}.{r.alias}")
        return self._point_alias(db, r.alias, r.collection_name, "create_alias")

    def _AlterAlias(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        if r.alias not in self._database(db)["aliases"]:
            raise _missing(f"alias {db}.{r.alias}")
        return self._point_alias(db, r.alias, r.collection_name, "alter_alias")

    def _point_alias(self, db: str, alias: str, name: str, op: str) -> tuple[Any, list[Change]]:
        database = self._database(db)
        if name not in database["collections"]:
            raise _missing(f"collection {db}.{name}")
        if database["aliases"].get(alias) == name:
            return common_pb2.Status(), []  # already so: nothing to announce
        database["aliases"][alias] = name
        return common_pb2.Status(), [Change(op, db, name, {"alias": alias})]

    def _DropAlias(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        aliases = self._database(db)["aliases"]
        if r.alias not in aliases:
            raise _missing(f"alias {db}.{r.alias}")
        collection = aliases.pop(r.alias)
        return common_pb2.Status(), [Change("drop_alias", db, collection, {"alias": r.alias})]

    # indexes
    def _DescribeIndex(self, r: Any) -> tuple[Any, list[Change]]:
        indexes = self._collection(r.db_name or DEFAULT_DB, r.collection_name)["indexes"]
        wanted = [n for n in sorted(indexes) if not r.index_name or n == r.index_name]
        if not wanted:
            raise _missing(f"index of {r.collection_name}")
        return milvus_pb2.DescribeIndexResponse(
            index_descriptions=[
                milvus_pb2.IndexDescription(
                    index_name=n,
                    field_name=indexes[n]["field"],
                    params=_kv(indexes[n]["params"]),
                    state=common_pb2.IndexState.Finished,
                )
                for n in wanted
            ]
        ), []

    def _CreateIndex(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        indexes = self._collection(db, r.collection_name)["indexes"]
        name = r.index_name or r.field_name
        params = _pairs(r.extra_params)
        known = indexes.get(name)
        if known is not None:
            if known == {"field": r.field_name, "params": params}:
                return common_pb2.Status(), []  # Milvus: the same index again is no error
            raise _exists(f"index {name} of {db}.{r.collection_name}")
        indexes[name] = {"field": r.field_name, "params": params}
        detail = {"index": name, "field": r.field_name, "params": params}
        return common_pb2.Status(), [Change("create_index", db, r.collection_name, detail)]

    def _AlterIndex(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        indexes = self._collection(db, r.collection_name)["indexes"]
        if r.index_name not in indexes:
            raise _missing(f"index {r.index_name} of {db}.{r.collection_name}")
        params = indexes[r.index_name]["params"]
        params.update(_pairs(r.extra_params))
        for key in r.delete_keys:
            params.pop(key, None)
        detail = {"index": r.index_name, "params": dict(params)}
        return common_pb2.Status(), [Change("alter_index", db, r.collection_name, detail)]

    def _DropIndex(self, r: Any) -> tuple[Any, list[Change]]:
        db = r.db_name or DEFAULT_DB
        indexes = self._collection(db, r.collection_name)["indexes"]
        names = (
            [r.index_name]
            if r.index_name
            else [n for n, i in indexes.items() if i["field"] == r.field_name]
        )
        if not names or any(n not in indexes for n in names):
            raise _missing(f"index {r.index_name or r.field_name} of {db}.{r.collection_name}")
        for name in names:
            del indexes[name]
        changes = [Change("drop_index", db, r.collection_name, {"index": n}) for n in names]
        return common_pb2.Status(), changes

    # load state and flush: kept so the pipeline's checks hold; no events (nothing to load)
    def _GetLoadState(self, r: Any) -> tuple[Any, list[Change]]:
        loaded = self._collection(r.db_name or DEFAULT_DB, r.collection_name)["loaded"]
        state = common_pb2.LoadState.LoadStateLoaded if loaded else common_pb2.LoadStateNotLoad
        return milvus_pb2.GetLoadStateResponse(state=state), []

    def _load(self, r: Any, loaded: bool) -> tuple[Any, list[Change]]:
        self._collection(r.db_name or DEFAULT_DB, r.collection_name)["loaded"] = loaded
        return common_pb2.Status(), []

    def _LoadCollection(self, r: Any) -> tuple[Any, list[Change]]:
        return self._load(r, True)

    def _LoadPartitions(self, r: Any) -> tuple[Any, list[Change]]:
        return self._load(r, True)

    def _ReleaseCollection(self, r: Any) -> tuple[Any, list[Change]]:
        return self._load(r, False)

    def _ReleasePartitions(self, r: Any) -> tuple[Any, list[Change]]:
        self._collection(r.db_name or DEFAULT_DB, r.collection_name)
        return common_pb2.Status(), []

    def _Flush(self, r: Any) -> tuple[Any, list[Change]]:
        for name in r.collection_names:
            self._collection(r.db_name or DEFAULT_DB, name)
        return milvus_pb2.FlushResponse(), []


def _database(properties: dict[str, str]) -> dict[str, Any]:
    return {"properties": properties, "aliases": {}, "collections": {}}


def field_view(f: schema_pb2.FieldSchema) -> dict[str, Any]:
    """A field as the DDL events show it."""
    view: dict[str, Any] = {
        "name": f.name,
        "field_id": f.fieldID,
        "type": schema_pb2.DataType.Name(f.data_type),
        "primary_key": f.is_primary_key,
    }
    if f.element_type:
        view["element_type"] = schema_pb2.DataType.Name(f.element_type)
    params = _pairs(f.type_params)
    if params:
        view["params"] = params
    for flag in ("is_partition_key", "nullable", "is_clustering_key", "is_function_output"):
        if getattr(f, flag, False):
            view[flag] = True
    if f.HasField("default_value"):
        view["default_value"] = _value(f.default_value)
    if f.description:
        view["description"] = f.description
    return view


def _value(value: schema_pb2.ValueField) -> Any:
    """A field's default value as JSON: its value (bytes as base64), None when unset."""
    kind = value.WhichOneof("data")
    if kind is None:
        return None
    found = getattr(value, kind)
    return base64.b64encode(found).decode() if isinstance(found, bytes) else found


def function_view(function: schema_pb2.FunctionSchema) -> dict[str, Any]:
    """A function (BM25: a VarChar in, a sparse vector out) as the DDL events show it. Its
    output is in no row event: a 2.6 WAL holds the input only, and a consumer computes it."""
    view: dict[str, Any] = {
        "name": function.name,
        "type": schema_pb2.FunctionType.Name(function.type),
        "input_field_names": list(function.input_field_names),
        "output_field_names": list(function.output_field_names),
    }
    params = _pairs(function.params)
    if params:
        view["params"] = params
    return view


def struct_view(struct: schema_pb2.StructArrayFieldSchema) -> dict[str, Any]:
    """An Array of Struct: its sub-fields under the names Milvus gives them
    (``<struct>[<sub>]``); its rows' values are lists of objects keyed by the short names."""
    return {
        "name": struct.name,
        "field_id": struct.fieldID,
        "type": "ArrayOfStruct",
        "fields": [field_view(f) for f in struct.fields],
    }


def schema_view(schema: schema_pb2.CollectionSchema) -> dict[str, Any]:
    view: dict[str, Any] = {
        "fields": [field_view(f) for f in schema.fields],
        "enable_dynamic_field": schema.enable_dynamic_field,
        "description": schema.description,
    }
    if schema.struct_array_fields:
        view["struct_array_fields"] = [struct_view(s) for s in schema.struct_array_fields]
    if schema.functions:
        view["functions"] = [function_view(f) for f in schema.functions]
    return view
