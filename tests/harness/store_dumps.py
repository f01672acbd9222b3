"""The metastores earlier releases wrote (tests/data/stores, made by bench/store_dumps.py),
loaded into a store of any backend for this release to open: the SQLite file copied, its rows
loaded into MariaDB (the SQL schema is the same in every release), the etcd dump put under a
root path."""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, create_engine, select

from metastore.keyring import KeyRing

DUMPS = Path(__file__).resolve().parents[1] / "data" / "stores"
RELEASES = ("0.1.0", "0.2.0", "0.3.0")
SQLITE_ROOT = "cdc"  # the root path of the SQLite dumps (the default rootPath)


@dataclass(frozen=True)
class Dump:
    """What ``release`` left in a store of ``kind`` ("sqlite" or "etcd")."""

    release: str
    kind: str

    @property
    def folder(self) -> Path:
        return DUMPS / self.release

    @cached_property
    def manifest(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.folder / "manifest.json").read_text())
        return dict(found[self.kind])

    @property
    def tasks(self) -> dict[str, dict[str, Any]]:
        """ "live" and "paused" -> task_id, collection, collection_id, state, secret."""
        return dict(self.manifest["tasks"])

    @property
    def channels(self) -> list[str]:
        return list(self.manifest["channels"])

    @property
    def target_rows(self) -> dict[int, str]:
        return {int(pk): tag for pk, tag in self.manifest["target_rows"].items()}

    @property
    def key_file(self) -> Path | None:
        """The key file the release sealed the secrets with (None: 0.1.0 kept them clear)."""
        path = self.folder / f"{self.kind}-secret.key"
        return path if path.exists() else None

    def key_ring(self) -> KeyRing:
        path = self.key_file
        return KeyRing.parse(path.read_text(), str(path)) if path else KeyRing(())

    def copy_sqlite(self, into: Path) -> Path:
        """The SQLite dump copied to ``into`` (root path ``SQLITE_ROOT``)."""
        shutil.copyfile(self.folder / "sqlite.db", into)
        return into

    def load_sql_rows(self, url: str, root: str) -> None:
        """Every row of the SQLite dump written into the database at ``url`` under ``root``
        (its tables made by opening a store there first)."""
        source = create_engine(f"sqlite:///{self.folder / 'sqlite.db'}")
        target = create_engine(url)
        tables = MetaData()
        tables.reflect(source)
        into = MetaData()
        into.reflect(target, only=list(tables.tables))
        try:
            with source.connect() as read, target.begin() as write:
                for name, table in tables.tables.items():
                    rows = [
                        {**row._mapping, "root_path": root}
                        for row in read.execute(select(table))
                        if row._mapping["root_path"] == SQLITE_ROOT
                    ]
                    if rows:
                        write.execute(into.tables[name].insert(), rows)
        finally:
            source.dispose()
            target.dispose()

    def load_etcd(self, client: Any, root: str, target_uri: str | None = None) -> None:
        """Every key of the etcd dump put under ``root``; with ``target_uri``, the tasks
        pointed at that target (see :func:`retarget_sqlite`)."""
        dumped: dict[str, dict[str, str]] = json.loads((self.folder / "etcd.json").read_text())
        for key, value in dumped.items():
            raw = value["text"].encode() if "text" in value else base64.b64decode(value["base64"])
            if target_uri is not None and key.startswith("tasks/"):
                record = json.loads(raw)
                record["spec"]["milvus_connect_param"]["uri"] = target_uri
                raw = json.dumps(record).encode()
            client.put(f"{root}/{key}", raw)


def retarget_sqlite(path: Path, uri: str) -> None:
    """Point every Milvus task of the SQLite store at ``path`` to the target at ``uri`` (the
    dump's target was a Milvus Lite of the run that made it; only the address changes)."""
    with sqlite3.connect(path) as db:
        for task_id, spec in db.execute("SELECT task_id, spec FROM cdc_tasks").fetchall():
            document = json.loads(spec)
            document["milvus_connect_param"]["uri"] = uri
            db.execute(
                "UPDATE cdc_tasks SET spec = ? WHERE task_id = ?", (json.dumps(document), task_id)
            )
