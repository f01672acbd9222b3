"""Pages copied as columns: the source's query answer (protobuf ``FieldData``, column by column)
sent on as the target's upsert, never turned into Python rows.

pymilvus turns a query answer into one dict per row, and an upsert's rows back into columns,
field by field and row by row: measured with cProfile on 100,000 rows read and upserted by
pymilvus, 8.6 of 9.5 s went to that packing. A copy needs of a page only its keys (the cursor,
the proof); the columns go to the target as they came, as ``DESIGN.md`` asks of the stream's
inserts. The requests are Milvus's public gRPC API (``QueryRequest``, ``UpsertRequest``, the
generated types pymilvus ships), sent through the pymilvus client's channel, so its address, TLS
and credentials apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException
from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from replicator.backfill.ranges import Key
from replicator.sinks.kafka_events import SCALAR_DATA

TIMEOUT = 120.0
DataType = schema_pb2.DataType
# an array cell's ``ScalarField`` member for each element type a Milvus accepts
_ARRAY_CELL = {**SCALAR_DATA, DataType.JSON: "json_data"}
# status code of a query on a collection without rows (pymilvus answers it with no rows)
EMPTY_COLLECTION = 26


@dataclass(frozen=True)
class ColumnPage:
    keys: list[Key]  # in the order of the rows, not sorted
    fields: list[Any]  # schema_pb2.FieldData, one per field


def query_columns(
    client: MilvusClient,
    db: str,
    collection: str,
    pk: str,
    expr: str,
    partition: str | None,
    limit: int,
    guarantee_ts: int,
    output_fields: Sequence[str] = ("*",),
) -> ColumnPage:
    """The ``output_fields`` (every field by default) of the rows matching ``expr`` (at most about
    ``limit``), read as ``transfer.MilvusRangeQuery`` reads: seeing every write up to
    ``guarantee_ts`` (0: Strong)."""
    request = milvus_pb2.QueryRequest(
        db_name=db,
        collection_name=collection,
        expr=expr,
        output_fields=list(output_fields),
        partition_names=[partition] if partition else [],
        guarantee_timestamp=guarantee_ts,
        consistency_level=common_pb2.Customized if guarantee_ts else common_pb2.Strong,
        use_default_consistency=False,
        query_params=[common_pb2.KeyValuePair(key="limit", value=str(limit))],
    )
    response = _stub(client).Query(request, timeout=TIMEOUT)
    if EMPTY_COLLECTION in (response.status.code, response.status.error_code):
        return ColumnPage([], [])
    _check(response.status, f"query of {collection}")
    fields = list(response.fields_data)
    column = next((field for field in fields if field.field_name == pk), None)
    if column is None:
        if not fields:
            return ColumnPage([], [])
        raise MilvusException(message=f"a query of {collection} answered without its key {pk}")
    scalars = column.scalars
    data = scalars.long_data.data if scalars.HasField("long_data") else scalars.string_data.data
    return ColumnPage(list(data), fields)


def function_outputs(fields: Sequence[dict[str, Any]]) -> frozenset[str]:
    """Of a collection's fields as pymilvus describes them, those a function fills (a BM25
    output): a query answers them, but a write must leave them out (Milvus refuses them: "BM25
    output field 'sparse' is generated; provide its source text instead") and the target
    computes them from their input."""
    return frozenset(f["name"] for f in fields if f.get("is_function_output"))


def generated_fields(client: MilvusClient, collection: str) -> frozenset[str]:
    """:func:`function_outputs` of ``collection``."""
    return function_outputs(client.describe_collection(collection)["fields"])


def upsert_columns(
    client: MilvusClient,
    db: str,
    collection: str,
    partition: str | None,
    page: ColumnPage,
    generated: frozenset[str] = frozenset(),
) -> None:
    """Upsert ``page``'s rows, as the source answered them, into ``collection``, without the
    ``generated`` fields (see :func:`generated_fields`)."""
    request = milvus_pb2.UpsertRequest(
        db_name=db,
        collection_name=collection,
        partition_name=partition or "",
        num_rows=len(page.keys),
    )
    request.fields_data.extend(f for f in page.fields if f.field_name not in generated)
    for field in request.fields_data:
        field.field_id = 0  # the target's field ids are its own: fields go by name
        if field.type == DataType.Array:
            type_empty_arrays(field, collection)
    response = _stub(client).Upsert(request, timeout=TIMEOUT)
    _check(response.status, f"upsert into {collection}")


def type_empty_arrays(field: Any, collection: str) -> None:
    """Give each empty array cell its element type. A 2.3.5 query answers an empty array as a
    cell with no member set; upserted so, 2.3.5's proxy dereferences the missing member while
    validating the array and the whole target process dies (SIGSEGV)."""
    arrays = field.scalars.array_data
    untyped = [cell for cell in arrays.data if cell.WhichOneof("data") is None]
    if not untyped:
        return
    member = _ARRAY_CELL.get(arrays.element_type)
    if member is None:
        raise MilvusException(
            message=f"collection {collection} field {field.field_name}: array of element type "
            f"{DataType.Name(arrays.element_type)} cannot be copied (an empty cell has no type)"
        )
    for cell in untyped:
        getattr(cell, member).SetInParent()


def page_keys(page: ColumnPage) -> list[Key]:
    return page.keys


def _stub(client: MilvusClient) -> Any:
    return client._get_connection()._stub


def _check(status: Any, what: str) -> None:
    code = status.code or status.error_code
    if code:
        raise MilvusException(code=code, message=f"{what}: {status.reason}")
