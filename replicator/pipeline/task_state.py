"""What a running task keeps in its metastore state, as typed accessors: the one place that
knows the keys and their encoding (JSON, except the in-flight bound, a decimal integer).

| key                                   | value                                                |
|---------------------------------------|------------------------------------------------------|
| ``inflight/<pchannel>``               | offset of the last record handed to the target       |
| ``drop/<collection>``                 | channels that reached a 2.3 DropCollection (list)    |
| ``drop-partition/<collection>/<name>``| channels that reached a 2.3 DropPartition (list)     |
| ``switch/<broadcast>/<pchannel>``     | vchannels of a pchannel that reached a WAL switch    |
| ``broadcast/<id>``                    | a 2.6 broadcast: ``{"arrived": [...]}`` or done      |
| ``collection/<id>``                   | a collection learnt from the WAL ("" once dropped)   |
| ``index/<collection>/<index id>``     | ``[field, index name]`` of a 2.6 index the task made |
| ``wal/<pchannel>/<generation>``       | a WAL the source switched to (kind, settings, tick)  |
| ``warnings``                          | the task's warnings (list of text)                   |
| ``kafka-groups``                      | the channel groups whose producers may be open (list)|
| ``import/<job id>``                   | a bulk import the source ran and its copy (imports)  |

Keys of the backfill job live in :mod:`replicator.backfill.state`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from metastore import MetaStore
from replicator.errors import UnfollowableSwitchError
from replicator.meta.catalog import COLLECTION_CREATED, CollectionMeta
from replicator.pipeline.wal_backend import WalSwitch, parse_backend

_COLLECTION = "collection/"
_INDEX = "index/"
_WARNINGS = "warnings"


@dataclass(frozen=True)
class BroadcastProgress:
    """A 2.6 broadcast as far as this task got: the vchannels whose copy was read, and whether
    it was applied."""

    arrived: frozenset[str] = frozenset()
    done: bool = False


class RunnerState:
    """The task's runner keys in the metastore (see the module docstring)."""

    def __init__(self, store: MetaStore, task_id: str) -> None:
        self._store = store
        self._task_id = task_id

    def _get(self, key: str) -> bytes | None:
        return self._store.get_state(self._task_id, key)

    def _put(self, key: str, value: bytes) -> None:
        self._store.put_state(self._task_id, key, value)

    def _get_json(self, key: str, default: Any) -> Any:
        raw = self._get(key)
        return json.loads(raw) if raw else default

    def _put_json(self, key: str, value: Any) -> None:
        self._put(key, json.dumps(value).encode())

    # --- the in-flight bound (see checkpoint.py) -------------------------------------------
    def inflight_bound(self, pchannel: str) -> int:
        """The offset up to which records may be on the target already; -1: none."""
        raw = self._get(f"inflight/{pchannel}")
        return int(raw) if raw else -1

    def set_inflight_bound(self, pchannel: str, offset: int) -> None:
        self._put(f"inflight/{pchannel}", str(offset).encode())

    # --- barrier sets: what has reached a barrier, kept across restarts ---------------------
    def _arrive(self, key: str, member: str) -> frozenset[str]:
        arrived = {*self._get_json(key, []), member}
        self._put_json(key, sorted(arrived))
        return frozenset(arrived)

    def arrive_at_drop(self, collection_id: int, pchannel: str) -> frozenset[str]:
        """``pchannel`` read a 2.3 DropCollection; the channels that have, now."""
        return self._arrive(f"drop/{collection_id}", pchannel)

    def arrive_at_partition_drop(
        self, collection_id: int, partition: str, pchannel: str
    ) -> frozenset[str]:
        return self._arrive(f"drop-partition/{collection_id}/{partition}", pchannel)

    # --- 2.3 partitions dropped, until a tick passes the drop (see sequencer.py) ----------
    def dropped_partitions(self, pchannel: str) -> list[tuple[int, str, int]]:
        """(collection id, partition, the drop's timestamp) of each drop ``pchannel`` read
        that no tick has passed yet."""
        return [(int(c), str(p), int(at)) for c, p, at in self._get_json(f"dropped/{pchannel}", [])]

    def save_dropped_partitions(self, pchannel: str, drops: list[tuple[int, str, int]]) -> None:
        self._put_json(f"dropped/{pchannel}", drops)

    def arrive_at_switch(self, broadcast_id: int, pchannel: str, vchannel: str) -> frozenset[str]:
        """A vchannel of ``pchannel`` read its copy of a WAL switch broadcast."""
        return self._arrive(f"switch/{broadcast_id}/{pchannel}", vchannel)

    # --- 2.6 broadcasts ----------------------------------------------------------------------
    def broadcast(self, broadcast_id: int) -> BroadcastProgress:
        record = self._get_json(f"broadcast/{broadcast_id}", {})
        return BroadcastProgress(frozenset(record.get("arrived", ())), bool(record.get("done")))

    def broadcast_arrived(self, broadcast_id: int, arrived: frozenset[str]) -> None:
        self._put_json(f"broadcast/{broadcast_id}", {"arrived": sorted(arrived)})

    def broadcast_done(self, broadcast_id: int) -> None:
        self._put_json(f"broadcast/{broadcast_id}", {"done": True})

    # --- collections and indexes learnt from the WAL ----------------------------------------
    def remember_collection(self, meta: CollectionMeta) -> None:
        """A collection created after the task started, known from its CreateCollection: a
        restart knows it even when the source catalog does not (a 2.6 source, or a collection
        the catalog dropped while its data is still to be read)."""
        self._put_json(
            f"{_COLLECTION}{meta.collection_id}",
            {
                "db": meta.db_name,
                "name": meta.name,
                "schema": base64.b64encode(meta.schema.SerializeToString()).decode("ascii"),
                "pchannels": list(meta.pchannels),
                "vchannels": list(meta.vchannels),
                "shards": meta.shards,
                "consistency": meta.consistency_level,
            },
        )

    def forget_collection(self, collection_id: int) -> None:
        self._put(f"{_COLLECTION}{collection_id}", b"")

    def collections(self) -> list[CollectionMeta]:
        found = []
        for key, value in self._store.list_state(self._task_id, _COLLECTION).items():
            if not value:
                continue  # dropped
            record = json.loads(value)
            found.append(
                CollectionMeta(
                    collection_id=int(key[len(_COLLECTION) :]),
                    db_id=0,
                    db_name=record["db"],
                    name=record["name"],
                    schema=schema_pb2.CollectionSchema.FromString(
                        base64.b64decode(record["schema"])
                    ),
                    pchannels=tuple(record["pchannels"]),
                    vchannels=tuple(record["vchannels"]),
                    shards=int(record["shards"]),
                    consistency_level=int(record["consistency"]),
                    state=COLLECTION_CREATED,
                    create_time=0,
                )
            )
        return found

    def remember_index(self, collection_id: int, index_id: int, field: str, name: str) -> None:
        """A 2.6 index the task made: the WAL names it only by id afterwards (DropIndex)."""
        self._put_json(f"{_INDEX}{collection_id}/{index_id}", [field, name])

    def indexes(self, collection_id: int) -> dict[int, tuple[str, str]]:
        """index id -> (field, index name) of the 2.6 indexes the task made on a collection."""
        prefix = f"{_INDEX}{collection_id}/"
        found = {}
        for key, value in self._store.list_state(self._task_id, prefix).items():
            field_name, index_name = json.loads(value)
            found[int(key[len(prefix) :])] = (str(field_name), str(index_name))
        return found

    # --- WAL switches (see wal_switch.py) ----------------------------------------------------
    def record_switch(self, pchannel: str, switch: WalSwitch) -> None:
        """Written before the position on the new WAL, so a restart finds how to reach it."""
        record = {"kind": switch.kind, "config": switch.config, "switch_ts": switch.switch_ts}
        self._put_json(f"wal/{pchannel}/{switch.generation}", record)

    def recorded_switch(self, pchannel: str, backend: str) -> WalSwitch:
        """How to reach the WAL a saved position names."""
        generation = parse_backend(backend)[1]
        record = self._get_json(f"wal/{pchannel}/{generation}", None)
        if record is None:
            raise UnfollowableSwitchError(
                f"channel {pchannel}: the saved position is on {backend}, but the task's state "
                "has no record of that WAL switch"
            )
        return WalSwitch(
            record["kind"], dict(record["config"]), int(record["switch_ts"]), generation
        )

    # --- bulk imports ------------------------------------------------------------------------
    def record_import(self, job_id: int, record: dict[str, Any]) -> None:
        self._put_json(f"import/{job_id}", record)

    def forget_import(self, job_id: int) -> None:
        self._put(f"import/{job_id}", b"")

    def imports(self) -> list[dict[str, Any]]:
        found = self._store.list_state(self._task_id, "import/")
        return [json.loads(value) for _key, value in sorted(found.items()) if value]

    # --- a Kafka target's channel groups (see replicator.sinks.kafka_groups) ----------------
    def kafka_groups(self) -> list[str]:
        """The groups whose producers the task may have left open (fenced at the next start)."""
        return [str(g) for g in self._get_json("kafka-groups", [])]

    def save_kafka_groups(self, groups: list[str]) -> None:
        self._put_json("kafka-groups", groups)

    # --- warnings ----------------------------------------------------------------------------
    def warnings(self) -> list[str]:
        return [str(w) for w in self._get_json(_WARNINGS, [])]

    def save_warnings(self, warnings: list[str]) -> None:
        self._put_json(_WARNINGS, warnings)
