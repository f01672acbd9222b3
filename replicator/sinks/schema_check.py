"""Does the target's collection hold every field of the source's? Asked once a collection is
created (or found) on the target, before any of its rows is written.

A target can accept a schema and keep less of it: Milvus Lite 3.2 creates a collection whose
schema has struct-array fields without them (and a dynamic collection would then take their
columns into ``$meta``); an older Milvus drops a flag it does not know (``nullable``), after
which a null arrives as a zero; Milvus 2.3 keeps no function (a BM25 output is then a plain
field no row fills). Rows written there would lose the field in silence, so the task
stops instead, naming the collection, each field and its type (lesson: a task never loses rows
in silence). A target that refuses the schema outright already says so in its answer.
"""

from __future__ import annotations

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TaskFailedError

_SYSTEM = {(0, "RowID"), (1, "Timestamp")}


def _type_name(field: schema_pb2.FieldSchema) -> str:
    name = str(schema_pb2.DataType.Name(field.data_type))
    if field.data_type in (schema_pb2.Array, schema_pb2.ArrayOfVector):
        name += f" of {schema_pb2.DataType.Name(field.element_type)}"
    return name


def _dim(field: schema_pb2.FieldSchema) -> str:
    """A vector field's dimension ("" for other fields)."""
    return next((p.value for p in field.type_params if p.key == "dim"), "")


def lost_fields(
    source: schema_pb2.CollectionSchema, target: schema_pb2.CollectionSchema
) -> list[str]:
    """The source's fields the target's schema does not hold as they are, each as
    ``name (type[, nullable])``; [] when it holds them all."""
    held = {f.name: f for f in target.fields}
    lost = []
    for field in source.fields:
        if (field.fieldID, field.name) in _SYSTEM or field.is_dynamic:
            continue
        kept = held.get(field.name)
        if kept is None or kept.data_type != field.data_type:
            lost.append(f"{field.name} ({_type_name(field)})")
        elif field.nullable and not kept.nullable:
            lost.append(f"{field.name} ({_type_name(field)}, nullable)")
        elif _dim(field) != _dim(kept):
            lost.append(
                f"{field.name} ({_type_name(field)}, dim {_dim(field)}; the target's has dim "
                f"{_dim(kept)})"
            )
    structs = {s.name for s in target.struct_array_fields}
    for struct_field in source.struct_array_fields:
        if struct_field.name not in structs:
            subs = ", ".join(f"{f.name} {_type_name(f)}" for f in struct_field.fields)
            lost.append(f"{struct_field.name} (ArrayOfStruct: {subs})")
    if source.enable_dynamic_field and not target.enable_dynamic_field:
        lost.append("$meta (JSON, the dynamic field)")
    return lost + _lost_functions(source, target)


def _function_view(function: schema_pb2.FunctionSchema) -> tuple[object, ...]:
    return function.type, tuple(function.input_field_names), tuple(function.output_field_names)


def _lost_functions(
    source: schema_pb2.CollectionSchema, target: schema_pb2.CollectionSchema
) -> list[str]:
    """A function (BM25: text in, sparse vector out) the target does not hold as the source
    does: its output field would be a plain field there, which no row the source writes fills
    (a 2.6 WAL holds the function's input, not its output), so each such output is named with
    its function. Compared by type, input and output names (a target numbers functions and
    fields itself)."""
    kept = {f.name: _function_view(f) for f in target.functions}
    by_name = {f.name: f for f in source.fields}
    lost = []
    for function in source.functions:
        if kept.get(function.name) == _function_view(function):
            continue
        kind = schema_pb2.FunctionType.Name(function.type)
        inputs = ", ".join(function.input_field_names)
        for output in function.output_field_names:
            field = by_name.get(output)
            type_name = _type_name(field) if field is not None else "?"
            lost.append(
                f"{output} ({type_name}, output of function {function.name}: {kind} of {inputs})"
            )
    return lost


def dropped_clustering_keys(
    source: schema_pb2.CollectionSchema, target: schema_pb2.CollectionSchema
) -> list[str]:
    """The source's clustering-key fields that the target made without the flag, though it
    holds every row exactly (Milvus Lite 3.2 and 2.3-2.4 do so in silence). Not a reason to
    stop: no value depends on it, but the target's clustering compaction will not use it."""
    held = {f.name: f for f in target.fields}
    return [
        field.name
        for field in source.fields
        if field.is_clustering_key and field.name in held and not held[field.name].is_clustering_key
    ]


def require_fields(
    what: str, source: schema_pb2.CollectionSchema, target: schema_pb2.CollectionSchema
) -> None:
    """Stop the task (``TaskFailedError``) when the target's collection ``what`` lacks a field
    of the source's."""
    lost = lost_fields(source, target)
    if lost:
        raise TaskFailedError(
            f"collection {what}: the target cannot hold field {'; '.join(lost)} of the "
            "source's schema (its collection was made without it), so no row is written "
            "there: replicate to a target that supports the type, or leave the collection "
            "out of the task"
        )
