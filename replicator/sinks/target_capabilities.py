"""What each kind of target can hold, decided from the schema before anything is created there.

A target that is handed a schema it cannot hold does not always refuse it: a Milvus 2.3.5
creates a Float16Vector collection, then its query node dies when the collection is loaded
(the task stayed Running, its target gone). So the engine asks the target what it is once
(``GetVersion``: a Milvus answers its release, "v2.3.5"; Milvus Lite answers
"milvus_lite-3.2.2"; a Kafka target holds everything, its events being JSON) and compares the
source's schema with :data:`FEATURES` before ``CreateCollection``. The check after creation
(:mod:`schema_check`) stays as a second line for what no table foresees.

Each feature names the first Milvus release that holds it, with where that comes from. The
README's "Target versions" table is rendered from the same rows (:func:`render_matrix`;
``python -m replicator.sinks.target_capabilities`` prints it, and a unit test compares).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TaskFailedError

S = schema_pb2


@dataclass(frozen=True, order=True)
class Version:
    """A Milvus release, ordered as releases are: 2.4.0-rc.1 < 2.4.0 < 2.4.1."""

    major: int
    minor: int
    patch: int
    # (1, ()) for a release; a pre-release ("rc.1") is (0, its parts) and sorts before it
    pre: tuple[int, tuple[tuple[int, int, str], ...]] = (1, ())

    @classmethod
    def parse(cls, text: str) -> Version | None:
        """A version as a server reports it ("v2.3.5", "2.4.0-rc.1", "v2.6.0"); None when
        the text is not one."""
        match = _VERSION.fullmatch(text.strip())
        if match is None:
            return None
        major, minor, patch, pre = match.groups()
        version = cls(int(major), int(minor), int(patch or 0))
        if pre:
            parts = tuple(
                (0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-]", pre) if p
            )
            version = cls(version.major, version.minor, version.patch, (0, parts))
        return version

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre[0] == 0:
            text += "-" + ".".join(str(n) if k == 0 else w for k, n, w in self.pre[1])
        return text


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-([0-9A-Za-z.\-]+))?(?:\+[0-9A-Za-z.\-]*)?")


def _v(text: str) -> Version:
    version = Version.parse(text)
    assert version is not None, text
    return version


@dataclass(frozen=True)
class Target:
    """What a task writes to: a Milvus server of a ``version`` (None: it reported none we
    can read), Milvus Lite, or a Kafka topic."""

    kind: str  # "milvus", "lite" or "kafka"
    version: Version | None = None
    reported: str = ""

    def __str__(self) -> str:
        if self.kind == "kafka":
            return "a Kafka topic"
        if self.kind == "lite":
            return f"Milvus Lite ({self.reported})" if self.reported else "Milvus Lite"
        return f"Milvus {self.version or self.reported or 'of an unknown version'}"


KAFKA = Target("kafka")


def target_of(reported: str) -> Target:
    """The target a ``GetVersion`` answer describes. Milvus Lite answers
    ``milvus_lite-<its version>`` (milvus_lite 3.2.2, ``adapter/grpc/servicer.py``
    ``GetVersion``; its ``Connect`` also names ``build_tags="milvus_lite"``)."""
    text = reported.strip()
    if text.lower().startswith(("milvus_lite", "milvus-lite")):
        return Target("lite", None, text)
    return Target("milvus", Version.parse(text), text)


Uses = list[tuple[str, str]]
"""The fields of a schema that use a feature, each with its type as the message names it."""


@dataclass(frozen=True)
class Feature:
    """A field type or schema feature: the first Milvus release that holds it, whether Milvus
    Lite holds it, and where each fact comes from. ``warn_only``: a target without it keeps
    every row exactly, so the task runs on with a warning (the clustering key)."""

    name: str
    first: Version
    lite: bool
    source: str
    uses: Callable[[schema_pb2.CollectionSchema], Uses]
    warn_only: bool = False

    def held_by(self, target: Target) -> bool | None:
        """True or False; None when it cannot be told (a version we cannot read)."""
        if target.kind == "kafka":
            return True
        if target.kind == "lite":
            return self.lite
        if target.version is None:
            return None
        return target.version >= self.first


# --- what a schema uses -----------------------------------------------------------------------
_VECTORS = {S.BinaryVector, S.FloatVector, S.Float16Vector, S.BFloat16Vector}
_VECTORS |= {S.SparseFloatVector, S.Int8Vector}


def _user_fields(schema: schema_pb2.CollectionSchema) -> Iterator[schema_pb2.FieldSchema]:
    for field in schema.fields:
        if (field.fieldID, field.name) in {(0, "RowID"), (1, "Timestamp")} or field.is_dynamic:
            continue
        yield field


def _type(field: schema_pb2.FieldSchema) -> str:
    return str(S.DataType.Name(field.data_type))


def _fields(
    keep: Callable[[schema_pb2.FieldSchema], bool], note: str = ""
) -> Callable[[schema_pb2.CollectionSchema], Uses]:
    def uses(schema: schema_pb2.CollectionSchema) -> Uses:
        return [(f.name, _type(f) + note) for f in _user_fields(schema) if keep(f)]

    return uses


def _none(schema: schema_pb2.CollectionSchema) -> Uses:
    return []  # held by every target: a row of the table only


def _of_type(data_type: int) -> Callable[[schema_pb2.CollectionSchema], Uses]:
    return _fields(lambda f: f.data_type == data_type)


def _struct_arrays(schema: schema_pb2.CollectionSchema) -> Uses:
    return [
        (s.name, "ArrayOfStruct: " + ", ".join(f"{f.name} {_type(f)}" for f in s.fields))
        for s in schema.struct_array_fields
    ]


def _functions(bm25: bool) -> Callable[[schema_pb2.CollectionSchema], Uses]:
    """Output fields of the schema's BM25 functions (``bm25``) or of its other functions."""

    def uses(schema: schema_pb2.CollectionSchema) -> Uses:
        types = {f.name: _type(f) for f in schema.fields}
        return [
            (
                output,
                f"{types.get(output, '?')}, output of function {function.name}: "
                f"{S.FunctionType.Name(function.type)} of {', '.join(function.input_field_names)}",
            )
            for function in schema.functions
            if (function.type == S.BM25) == bm25
            for output in function.output_field_names
        ]

    return uses


def _dynamic(schema: schema_pb2.CollectionSchema) -> Uses:
    return [("$meta", "JSON, the dynamic field")] if schema.enable_dynamic_field else []


def _second_vectors(schema: schema_pb2.CollectionSchema) -> Uses:
    vectors = [f for f in _user_fields(schema) if f.data_type in _VECTORS]
    return [(f.name, f"{_type(f)}, a second vector field") for f in vectors[1:]]


_NULLABLE_SCALAR = _fields(lambda f: f.nullable and f.data_type not in _VECTORS, ", nullable")
_NULLABLE_VECTOR = _fields(lambda f: f.nullable and f.data_type in _VECTORS, ", nullable")
_DEFAULT = _fields(lambda f: f.HasField("default_value"), ", with a default value")


# Sources: release notes (github.com/milvus-io/milvus/releases, milvus.io/docs/release_notes.md)
# and the "Compatible with Milvus x+" banner of each type's page on milvus.io/docs. Milvus
# Lite's column: milvus_lite 3.2.2's schema/types.py maps Bool, Int8-64, Float, Double,
# VarChar, JSON, Array, Geometry, Timestamptz, FloatVector and SparseFloatVector and no other
# type; the e2e suite shows the rest (tests/e2e/test_stream_field_types.py).
def _typed(data_type: int, first: str, lite: bool, source: str) -> Feature:
    """The feature of one data type, named as Milvus names it."""
    return Feature(str(S.DataType.Name(data_type)), _v(first), lite, source, _of_type(data_type))


_PROTO = "milvus-proto schema.proto of Milvus 2.0"
_RN_229 = "Milvus v2.2.9 release notes (JSON, dynamic schema, partition key)"
_RN_24 = "Milvus v2.4.0-rc.1 release notes (Float16/BFloat16, sparse and multi-vector)"
_NULL_DOCS = "milvus.io docs nullable-and-default (first in the v2.5.x docs; 2.3.5 drops the flag)"
FEATURES: tuple[Feature, ...] = (
    Feature("Bool, Int8-64, Float, Double, VarChar", _v("2.0.0"), True, _PROTO, _none),
    Feature("FloatVector", _v("2.0.0"), True, _PROTO, _none),
    _typed(S.BinaryVector, "2.0.0", False, f"{_PROTO}; Lite 3.2.2 refuses it at create"),
    _typed(S.JSON, "2.2.9", True, _RN_229),
    Feature("dynamic field ($meta)", _v("2.2.9"), True, _RN_229, _dynamic),
    Feature("partition key", _v("2.2.9"), True, _RN_229, _fields(lambda f: f.is_partition_key)),
    Feature(
        "default value",
        _v("2.3.0"),
        True,
        "pymilvus 2.3 FieldSchema(default_value=...); a 2.3.5 keeps it (README Field types, R)",
        _DEFAULT,
    ),
    _typed(S.Array, "2.3.0", True, "Milvus v2.3.0 release notes (Array data type)"),
    _typed(
        S.Float16Vector,
        "2.4.0-rc.1",
        False,
        f"{_RN_24}; a 2.3.5 creates it, then its query node dies on load (README, by hand)",
    ),
    _typed(
        S.BFloat16Vector,
        "2.4.0-rc.1",
        False,
        f"{_RN_24}; a 2.3.5 creates it, then aborts on load (README, by hand)",
    ),
    _typed(S.SparseFloatVector, "2.4.0-rc.1", True, _RN_24),
    Feature("a second vector field", _v("2.4.0-rc.1"), True, _RN_24, _second_vectors),
    Feature(
        "clustering key",
        _v("2.4.8"),
        False,
        "Milvus v2.4.8 release notes (clustering compaction on a clustering key); Lite 3.2.2 "
        "and a 2.3.5 make the field without the flag",
        _fields(lambda f: f.is_clustering_key),
        warn_only=True,
    ),
    Feature("nullable field", _v("2.5.0"), True, _NULL_DOCS, _NULLABLE_SCALAR),
    Feature(
        "BM25 function",
        _v("2.5.0"),
        True,
        "Milvus 2.5 release (milvus.io blog 2024-12-17: full-text search with BM25)",
        _functions(bm25=True),
    ),
    _typed(
        S.Int8Vector,
        "2.6.0",
        False,
        "pymilvus DataType reference: INT8_VECTOR in v2.6.x, absent from v2.4.x",
    ),
    Feature(
        "other functions (text embedding)",
        _v("2.6.0"),
        True,
        "Milvus v2.6.0 docs (embedding function); Lite 3.2.2 schema/validation.py checks them",
        _functions(bm25=False),
    ),
    _typed(
        S.Geometry, "2.6.4", True, "milvus.io docs geometry-field: Compatible with Milvus 2.6.4+"
    ),
    Feature(
        "ArrayOfStruct",
        _v("2.6.4"),
        False,
        "milvus.io docs array-of-structs: Compatible with Milvus 2.6.4+; Lite 3.2.2 makes "
        "the collection without the field",
        _struct_arrays,
    ),
    _typed(
        S.Timestamptz,
        "2.6.6",
        True,
        "milvus.io docs timestamptz-field: Compatible with Milvus 2.6.6+",
    ),
    Feature(
        "nullable vector field",
        _v("2.6.18"),
        True,
        "README Field types (Milvus 2.6.18 and later); Lite 3.2.2 takes the rows, answering "
        "a null as a zero vector",
        _NULLABLE_VECTOR,
    ),
)


def unholdable(schema: schema_pb2.CollectionSchema, target: Target) -> list[str]:
    """The fields of ``schema`` the target cannot hold, each as ``name (its type, what it
    uses; who holds it)``; [] when it holds them all, or when that cannot be told (a version
    we cannot read: the check after creation then decides)."""
    lost = []
    for feature in FEATURES:
        if feature.warn_only or feature.held_by(target) is not False:
            continue
        for name, what in feature.uses(schema):
            if target.kind == "lite":
                lost.append(f"{name} ({what}; Milvus Lite holds no {feature.name})")
            else:
                lost.append(f"{name} ({what}; {feature.name} is held from Milvus {feature.first})")
    return lost


def require_holdable(
    what: str,
    schema: schema_pb2.CollectionSchema,
    target: Target,
    doing: str = "the collection is not created",
) -> None:
    """Stop the task (``TaskFailedError``) before the collection ``what`` is created (or, as
    ``doing`` says, a field or a function added) on a target that cannot hold a field of
    ``schema``."""
    lost = unholdable(schema, target)
    if lost:
        raise TaskFailedError(
            f"collection {what}: the target ({target}) cannot hold field {'; '.join(lost)} "
            f"of the source's schema, so {doing} there: replicate to a target that supports "
            "the type, or leave the collection out of the task"
        )


# --- the README's table -----------------------------------------------------------------------
MATRIX_COLUMNS: tuple[tuple[str, Target], ...] = (
    ("Milvus 2.3", Target("milvus", _v("2.3.0"))),
    ("Milvus 2.4", Target("milvus", _v("2.4.0"))),
    ("Milvus 2.5", Target("milvus", _v("2.5.0"))),
    ("Milvus 2.6", Target("milvus", _v("2.6.0"))),
    ("Milvus Lite", Target("lite")),
    ("Kafka", KAFKA),
)
MATRIX_BEGIN = "<!-- target-matrix: begin (python -m replicator.sinks.target_capabilities) -->"
MATRIX_END = "<!-- target-matrix: end -->"


def _cell(feature: Feature, target: Target, column: str) -> str:
    if feature.held_by(target):
        return "yes"
    if target.kind == "milvus" and target.version is not None:
        minor = Version(target.version.major, target.version.minor, 99)
        if minor >= feature.first:  # held from a later patch release of this minor
            return f"from {feature.first}"
    return "warned" if feature.warn_only else "refused"


def render_matrix() -> str:
    """The README's table: each feature against each kind of target, from :data:`FEATURES`."""
    head = ["type or feature", "first Milvus", *(name for name, _ in MATRIX_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for feature in FEATURES:
        cells = [_cell(feature, target, name) for name, target in MATRIX_COLUMNS]
        lines.append(f"| {feature.name} | {feature.first} | " + " | ".join(cells) + " |")
    return "\n".join([MATRIX_BEGIN, *lines, MATRIX_END])


if __name__ == "__main__":
    print(render_matrix())
