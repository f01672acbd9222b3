"""Benchmark: ways to build a Kafka target's row events from an insert's columns, in µs a row,
each checked byte for byte against the row-at-a-time events (the format of
``replicator/sinks/kafka_events.py``).

An insert of ROWS rows as Milvus sends it (``schema_pb2.FieldData``): ``id`` Int64, ``vec`` an
8-float vector, ``title`` a 16-character VarChar, and with ``--dynamic`` a dynamic field of two
keys. Each way makes every row's key and complete value (``source`` appended, as a commit
does), in a process of its own (the garbage of one way slowed the next by 2-4x); the median of
15 runs counts.

- *row at a time*: a dict a row from the columns, ``orjson.dumps`` a row, the envelope joined
  (what the target did before; kept for struct arrays, ``kafka_columns._by_rows``);
- *orjson a value*: each column's values serialized one by one (``map(orjson.dumps, ...)``),
  the rows joined by ``map(b"".join, zip(...))``;
- *orjson a column, cut* (the target now, ``kafka_columns.insert_events``): each column
  serialized whole, cut at its separators, the rows joined as above;
- *polars, whole events*: a DataFrame of the columns and the envelope, ``write_ndjson``;
- *polars, rows*: ``write_ndjson`` of the columns, the envelope joined.

    python bench/kafka_event_builders.py [--rows 5000] [--dynamic]

The polars ways run only where polars is installed (it is not a dependency of the project).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path

import numpy as np
import orjson
from pymilvus.grpc_gen import schema_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.sinks.kafka_columns import (
    Envelope,
    Rows,
    _by_rows,
    insert_events,
    topic_runs,
)
from replicator.sinks.kafka_events import column_values, dumps, key_prefix, ts_view

T = schema_pb2.DataType
HYBRID = (1_795_392_000_000 << 18) | 5
SOURCE = {"channel": "by-dev-rootcoord-dml_0", "position": "0a00000000000000", "commit": "c" * 32}
Built = tuple[list[bytes], list[bytes]]  # keys, values


class Log:
    def __init__(self) -> None:
        self.events: list = []

    def add_rows(self, rows: Rows) -> None:
        self.events.append(rows)


def columns(rows: int, dynamic: bool) -> list[schema_pb2.FieldData]:
    rng = np.random.default_rng(1)
    pk = schema_pb2.FieldData(type=T.Int64, field_name="id")
    pk.scalars.long_data.data.extend(range(rows))
    vec = schema_pb2.FieldData(
        type=T.FloatVector, field_name="vec", vectors=schema_pb2.VectorField(dim=8)
    )
    vec.vectors.float_vector.data.extend(rng.random(rows * 8, dtype=np.float32).tolist())
    title = schema_pb2.FieldData(type=T.VarChar, field_name="title")
    title.scalars.string_data.data.extend([f"title-{i:010d}" for i in range(rows)])
    found = [pk, vec, title]
    if dynamic:
        meta = schema_pb2.FieldData(type=T.JSON, field_name="$meta", is_dynamic=True)
        meta.scalars.json_data.data.extend([b'{"color": "red", "n": %d}' % i for i in range(rows)])
        found.append(meta)
    return found


def envelope() -> Envelope:
    shared = dumps({"db": "default", "collection": "c", "partition": "_default"})[1:-1]
    return Envelope(
        b'{"op":"insert",' + shared + b',"pk":',
        b',"ts":' + dumps(ts_view(HYBRID)),
        key_prefix("default", "c"),
    )


TAIL = b',"source":' + dumps(SOURCE) + b"}"


def row_at_a_time(cols: list[schema_pb2.FieldData], rows: int) -> Built:
    keys, bodies = _by_rows(cols, rows, "id", envelope())
    return keys, [b + TAIL for b in bodies]


def the_target(cols: list[schema_pb2.FieldData], rows: int) -> Built:
    log = Log()
    insert_events(log, "t", "default", "c", "_default", "id", cols, rows, HYBRID, {})
    ((_, keys, values),) = topic_runs(log.events, SOURCE, 1_000_000)
    return keys, values


def orjson_a_value(cols: list[schema_pb2.FieldData], rows: int) -> Built:
    head, when, prefix = envelope()
    parts: list = []
    pks: list[bytes] = []
    for n, column in enumerate(cols):
        pieces = list(map(dumps, column_values(column, rows)))
        if column.is_dynamic:
            parts += [b"", [b"," + p[1:-1] if len(p) > 2 else b"" for p in pieces]]
            continue
        if column.field_name == "id":
            pks = pieces
        parts += [(b"," if n else b',"row":{') + dumps(column.field_name) + b":", pieces]
    keys = list(map(b"".join, zip(repeat(prefix), pks, repeat(b"]"))))
    sequences = [repeat(head), pks]
    sequences += [repeat(p) if isinstance(p, bytes) else p for p in parts]
    sequences.append(repeat(b"}" + when + TAIL))
    return keys, list(map(b"".join, zip(*sequences, strict=False)))


def polars_frame(cols: list[schema_pb2.FieldData]):
    import polars as pl

    data = {}
    for column in cols:
        if column.type == T.FloatVector:
            flat = np.asarray(column.vectors.float_vector.data, dtype=np.float32)
            data[column.field_name] = flat.astype(np.float64).reshape(-1, column.vectors.dim)
        elif column.type == T.Int64:
            data[column.field_name] = np.asarray(column.scalars.long_data.data, dtype=np.int64)
        elif column.type == T.VarChar:
            data[column.field_name] = list(column.scalars.string_data.data)
        else:
            raise NotImplementedError("polars: a dynamic field is not tried")
    return pl.DataFrame(data)


def polars_whole(cols: list[schema_pb2.FieldData], rows: int) -> Built:
    import polars as pl

    view = ts_view(HYBRID)
    frame = polars_frame(cols).select(
        pl.lit("insert").alias("op"),
        pl.lit("default").alias("db"),
        pl.lit("c").alias("collection"),
        pl.lit("_default").alias("partition"),
        pl.col("id").alias("pk"),
        pl.struct(pl.all()).alias("row"),
        pl.struct(
            pl.lit(view["hybrid"], dtype=pl.Int64).alias("hybrid"),
            pl.lit(view["time"]).alias("time"),
        ).alias("ts"),
    )
    blob = frame.write_ndjson().encode()
    values = blob.replace(b"}\n", TAIL + b"\n").split(b"\n")[:-1]
    pks = orjson.dumps(list(cols[0].scalars.long_data.data))[1:-1].split(b",")
    prefix = envelope().prefix
    return list(map(b"".join, zip(repeat(prefix), pks, repeat(b"]")))), values


def polars_rows(cols: list[schema_pb2.FieldData], rows: int) -> Built:
    head, when, prefix = envelope()
    found = polars_frame(cols).write_ndjson().encode().split(b"\n")[:-1]
    pks = orjson.dumps(list(cols[0].scalars.long_data.data))[1:-1].split(b",")
    keys = list(map(b"".join, zip(repeat(prefix), pks, repeat(b"]"))))
    sequences = (repeat(head), pks, repeat(b',"row":'), found, repeat(when + TAIL))
    return keys, list(map(b"".join, zip(*sequences, strict=False)))


def timed(way: Callable[[list, int], Built], cols: list, rows: int) -> tuple[float, float]:
    times = []
    for _ in range(15):
        started = time.perf_counter()
        way(cols, rows)
        times.append(time.perf_counter() - started)
    return statistics.median(times) / rows * 1e6, min(times) / rows * 1e6


WAYS = {
    "row at a time (before)": row_at_a_time,
    "orjson a value, rows joined": orjson_a_value,
    "orjson a column, cut, rows joined (the target now)": the_target,
    "polars, whole events (write_ndjson)": polars_whole,
    "polars, rows (write_ndjson), envelope joined": polars_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--way", type=int, help="(internal) run this way only, in this process")
    args = parser.parse_args()
    if args.way is None:  # each way in a process of its own: one's garbage slows the next
        print("| way | µs a row (median) | µs a row (best) | bytes as the format |")
        print("|---|---|---|---|")
        for n in range(len(WAYS)):
            command = [sys.executable, __file__, "--rows", str(args.rows), "--way", str(n)]
            subprocess.run(command + (["--dynamic"] if args.dynamic else []), check=True)
        return
    cols = columns(args.rows, args.dynamic)
    name, way = list(WAYS.items())[args.way]
    try:
        same = way(cols, args.rows) == row_at_a_time(cols, args.rows)
    except (ImportError, NotImplementedError) as exc:
        print(f"| {name} | - | - | not run: {exc} |")
        return
    median, best = timed(way, cols, args.rows)
    print(f"| {name} | {median:.2f} | {best:.2f} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
