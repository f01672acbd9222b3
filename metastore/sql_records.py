"""The SQL metastore's records of a root path (:mod:`metastore.sql`): versioned records written
by compare-and-set (the DR pairs), the ids of the keys secrets are sealed with, and the format of
the stored data."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from metastore.base import StoreFormat
from metastore.errors import MetaStoreUnavailableError
from metastore.sql_plumbing import SqlPlumbing
from metastore.sql_schema import records_table, secret_keys_table, store_format_table


class SqlRecords(SqlPlumbing):
    """Records of the root path, the secret keys' ids, the store's format."""

    # --- the ids of the keys secrets are sealed with ------------------------------------------
    def _secret_key(self, key_id: str) -> Any:
        return and_(
            secret_keys_table.c.root_path == self.root_path,
            secret_keys_table.c.key_id == key_id,
        )

    def secret_key_ids(self) -> dict[str, int]:
        query = select(secret_keys_table.c.key_id, secret_keys_table.c.version).where(
            secret_keys_table.c.root_path == self.root_path
        )
        with self._tx() as conn:
            return {row.key_id: int(row.version) for row in conn.execute(query)}

    def record_secret_key_id(self, key_id: str) -> None:
        for _attempt in range(3):  # another daemon inserted the same id at the same moment
            try:
                with self._tx() as conn:
                    raised = conn.execute(
                        update(secret_keys_table)
                        .where(self._secret_key(key_id))
                        .values(version=secret_keys_table.c.version + 1, recorded_at=time.time())
                    ).rowcount
                    if not raised:
                        conn.execute(
                            insert(secret_keys_table).values(
                                root_path=self.root_path,
                                key_id=key_id,
                                version=1,
                                recorded_at=time.time(),
                            )
                        )
                return
            except IntegrityError:
                continue
        raise MetaStoreUnavailableError(
            f"secret key id {key_id}: recorded by other daemons at the same moment; try again"
        )

    def forget_secret_key_id(self, key_id: str, version: int) -> bool:
        with self._tx() as conn:
            removed = conn.execute(
                delete(secret_keys_table).where(
                    self._secret_key(key_id), secret_keys_table.c.version == version
                )
            ).rowcount
        return bool(removed)

    # --- records of the root path ------------------------------------------------------------
    def _record(self, key: str) -> Any:
        return (records_table.c.root_path == self.root_path) & (records_table.c.record_key == key)

    def get_record(self, key: str) -> tuple[bytes, int] | None:
        query = select(records_table.c.value, records_table.c.version).where(self._record(key))
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else (bytes(row.value), int(row.version))

    def list_records(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        query = select(
            records_table.c.record_key, records_table.c.value, records_table.c.version
        ).where(
            records_table.c.root_path == self.root_path,
            records_table.c.record_key.startswith(prefix, autoescape=True),
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return {str(r.record_key): (bytes(r.value), int(r.version)) for r in rows}

    def put_record(self, key: str, value: bytes, expected: int | None) -> int | None:
        try:
            with self._tx() as conn:
                if expected is None:
                    conn.execute(
                        insert(records_table).values(
                            root_path=self.root_path, record_key=key, value=value, version=1
                        )
                    )
                    return 1
                changed = conn.execute(
                    update(records_table)
                    .where(self._record(key), records_table.c.version == expected)
                    .values(value=value, version=expected + 1)
                ).rowcount
                return expected + 1 if changed else None
        except IntegrityError:  # another daemon stored it first
            return None

    def delete_record(self, key: str, expected: int) -> bool:
        with self._tx() as conn:
            removed = conn.execute(
                delete(records_table).where(self._record(key), records_table.c.version == expected)
            ).rowcount
        return bool(removed)

    # --- the format of the data --------------------------------------------------------------
    def store_format(self) -> StoreFormat | None:
        query = select(store_format_table.c.version, store_format_table.c.release).where(
            store_format_table.c.root_path == self.root_path
        )
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else StoreFormat(int(row.version), str(row.release))

    def set_store_format(self, expected: int | None, new: StoreFormat) -> bool:
        values = {"version": new.version, "release": new.release, "updated_at": time.time()}
        try:
            with self._tx() as conn:
                if expected is None:
                    conn.execute(
                        insert(store_format_table).values(root_path=self.root_path, **values)
                    )
                    return True
                changed = conn.execute(
                    update(store_format_table)
                    .where(
                        store_format_table.c.root_path == self.root_path,
                        store_format_table.c.version == expected,
                    )
                    .values(**values)
                ).rowcount
                return bool(changed)
        except IntegrityError:  # another daemon recorded a format first
            return False
