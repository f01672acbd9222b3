"""The store's format as this daemon keeps it: migrated at start as far as every live fleet member
reads, and the rest (a breaking step some member cannot read yet) tried again by the scheduler
until the store is in this release's format (rules: ``metastore/format.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from metastore import MetaStore, MetaStoreError, StoreFormat
from metastore.format import (
    MIGRATIONS,
    STORE_FORMAT,
    Migration,
    fleet_formats,
    log_wait,
    migrate_store,
)
from replicator.config.release import RELEASE

log = logging.getLogger(__name__)

# seconds between tries of a breaking step that waits for older fleet members
RETRY_SECONDS = 10.0


class StoreFormatKeeper:
    """Migrates ``store`` towards ``latest`` for the fleet member ``member_id``; ``current`` is
    the format the store is in, which this daemon writes."""

    def __init__(
        self,
        store: MetaStore,
        member_id: str,
        *,
        release: str = RELEASE,
        latest: int = STORE_FORMAT,
        migrations: Mapping[int, Migration] = MIGRATIONS,
    ) -> None:
        """``release``, ``latest`` and ``migrations``: this release's (a test gives others)."""
        self.store = store
        self.member_id = member_id
        self.release = release
        self.latest = latest
        self.migrations = migrations
        self.current: StoreFormat | None = None
        self._waited_for: list[str] = []  # the members a breaking step waited for, last said

    @property
    def pending(self) -> bool:
        """Whether a breaking step still waits for the fleet (or nothing was migrated yet)."""
        return self.current is None or self.current.version < self.latest

    def migrate(self) -> StoreFormat:
        """Every step the fleet reads, now (``StoreFormatError``: see ``migrate_store``)."""
        self.current = migrate_store(
            self.store,
            self.release,
            latest=self.latest,
            migrations=self.migrations,
            fleet=lambda: fleet_formats(self.store, self.member_id),
            on_wait=self._say_wait,
        )
        return self.current

    def _say_wait(self, store: MetaStore, step: Migration, behind: list[str]) -> None:
        """The wait said once per set of members (the scheduler asks every few seconds)."""
        if behind != self._waited_for:
            self._waited_for = behind
            log_wait(store, step, behind)

    async def retry(self) -> None:
        """The scheduler's job: the waiting steps tried again; a failure is logged and the store
        stays in the format it is in (which this daemon goes on writing)."""
        if not self.pending:
            return
        try:
            found = await asyncio.to_thread(self.migrate)
        except MetaStoreError as exc:  # StoreFormatError included
            log.error("metastore format not raised (tried again later): %s", exc)
            return
        if not self.pending:
            log.info("metastore is in format %d: every fleet member reads it", found.version)
