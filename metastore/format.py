"""The format of the data a store holds, and the migrations from each earlier format.

Every root path records the format its data is in (``MetaStore.store_format``). A daemon
reads every earlier format of this project and migrates it forward itself, at start, before
it reads a task:

====== ========== ===============================================================
format releases   what changed
====== ========== ===============================================================
1      0.1 - 0.3  tasks, positions, state, leases, members, secret key ids; no
                  format recorded (a store without a record is in format 1)
2      0.4        the format is recorded; no record changes meaning, so releases
                  0.1 - 0.3 read a format-2 store exactly as before
====== ========== ===============================================================

Rules every migration keeps:

- **Forward only, one step at a time**, each step ``N -> N + 1`` a function of this module.
- **Additive until it is done.** A step writes what the new format adds and removes nothing
  the old one needs; only once it has finished is the version raised, in one compare-and-set
  (``set_store_format``). A step that fails half-way leaves the store in its old format,
  readable by the release that wrote it, and is run again from the start next time: steps
  are idempotent.
- **Once, whoever starts first.** Two daemons starting together may both run a step (it is
  idempotent); only one raises the version, the other sees the new version and goes on.
- **A newer format is refused, touching nothing**: the error names both formats and the
  release that wrote the store.
- **A breaking step waits for the fleet.** A step marked ``breaking`` changes what records
  mean: a release that reads only the formats before it cannot read the store after it. It is
  applied only when every other live member of the fleet (the store's members, by their
  heartbeats' ``store_format``: the newest format each reads; a member of a release before 0.4
  names none and reads format 1) reads its format. Until then the store stays in the format
  before it, the release keeps writing that format (``migrate_store`` returns it: code that
  writes a breaking format's records asks for it), and the daemon tries again on a timer
  (server/runtime/store_format.py). An older release that starts after the step refuses the
  store by name (above). A member that starts in the instant between the check and the raise,
  before its first heartbeat, is not seen: an older member of the fleet is stopped before the
  last one is started in the new release.
- **A running member reads the format again at every heartbeat** (server/tasks/fleet_rounds.py):
  one that finds the store past what it reads (a newer member raised it while this one's
  heartbeat had lapsed, say) stops its runners, gives up its leases, takes no task, and says
  why in ``/readyz`` and its log, until the store is in a format it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from metastore.base import Member, MetaStore, StoreFormat
from metastore.errors import StoreFormatError

log = logging.getLogger(__name__)

STORE_FORMAT = 2  # the format this release writes
UNRECORDED = 1  # the format of a store with no format record (releases 0.1 - 0.3)


@dataclass(frozen=True)
class Migration:
    """One step from format ``to - 1`` to ``to``: what it does, and the function doing it."""

    to: int
    summary: str
    apply: Callable[[MetaStore], None]
    # releases reading only formats before ``to`` cannot read the store after this step: it
    # waits until every live fleet member reads ``to`` (the module's rules)
    breaking: bool = False


@dataclass(frozen=True)
class MemberFormat:
    """What one live fleet member runs: its release ("" before 0.4.0, whose heartbeats name
    none) and the newest store format it reads."""

    release: str
    reads: int


# the other live members of the fleet, by id; read before each breaking step
FleetFormats = Callable[[], Mapping[str, MemberFormat]]


def member_format(member: Member) -> MemberFormat:
    """The release and newest readable format a member's heartbeat names."""
    reads = member.info.get("store_format")
    return MemberFormat(
        str(member.info.get("release") or ""), reads if isinstance(reads, int) else UNRECORDED
    )


def fleet_formats(store: MetaStore, own_member_id: str) -> dict[str, MemberFormat]:
    """Each live member of the store's fleet but ``own_member_id`` (whose heartbeat of an
    earlier run may still be live), with what it reads."""
    return {m.member_id: member_format(m) for m in store.members() if m.member_id != own_member_id}


def _record_the_format(store: MetaStore) -> None:
    """Format 1 -> 2: nothing to rewrite; raising the version records the format."""


MIGRATIONS: Mapping[int, Migration] = {
    1: Migration(2, "record the store's format (no record changes)", _record_the_format),
}


def check_readable(store: MetaStore, release: str, latest: int = STORE_FORMAT) -> int:
    """The store's format version, or ``StoreFormatError`` when it is newer than ``latest``
    (the store was written by a newer release; nothing is changed)."""
    return _readable_version(store, store.store_format(), release, latest)


def _readable_version(
    store: MetaStore, found: StoreFormat | None, release: str, latest: int
) -> int:
    """The version of ``found`` (the store's recorded format), refused when newer than
    ``latest``."""
    version = found.version if found is not None else UNRECORDED
    if version > latest:
        writer = found.release if found is not None else "?"
        raise StoreFormatError(
            f"the metastore (rootPath {store.root_path}) holds data in format {version}, "
            f"written by release {writer}; release {release} reads formats 1 to {latest} only. "
            "Run a release that reads it (nothing was changed)"
        )
    return version


def migrate_store(
    store: MetaStore,
    release: str,
    *,
    latest: int = STORE_FORMAT,
    migrations: Mapping[int, Migration] = MIGRATIONS,
    fleet: FleetFormats | None = None,
    on_wait: Callable[[MetaStore, Migration, list[str]], None] | None = None,
) -> StoreFormat:
    """Bring the store's data to format ``latest``, one step at a time (see the module's rules);
    the format it is in once done: before ``latest`` when a breaking step waits for members of
    ``fleet`` that cannot read it (None: no other member is asked about). ``StoreFormatError``
    for a newer format (nothing changed) or a step that failed (the store stays in the format
    before it). ``on_wait`` is told of a breaking step that waits and the members it waits for
    (by default a warning is logged)."""
    for _ in range(latest + 1):  # one read per step, and one more to see it done
        found = store.store_format()
        version = _readable_version(store, found, release, latest)
        if version == latest:
            return found if found is not None else StoreFormat(UNRECORDED, "")
        step = migrations.get(version)
        if step is None or step.to != version + 1:
            raise StoreFormatError(
                f"the metastore (rootPath {store.root_path}) is in format {version}, and "
                f"release {release} has no migration from it to format {version + 1}"
            )
        behind = unready_readers(step, fleet()) if step.breaking and fleet is not None else []
        if behind:
            (on_wait or log_wait)(store, step, behind)
            return found if found is not None else StoreFormat(UNRECORDED, "")
        log.info(
            "metastore (rootPath %s): migrating from format %d to %d: %s",
            store.root_path,
            version,
            step.to,
            step.summary,
        )
        try:
            step.apply(store)
        except StoreFormatError:
            raise
        except Exception as exc:
            raise StoreFormatError(
                f"the metastore (rootPath {store.root_path}) could not be migrated from format "
                f"{version} to {step.to} ({step.summary}): {type(exc).__name__}: {exc}; it is "
                f"still in format {version}, which the release that wrote it reads"
            ) from exc
        expected = found.version if found is not None else None
        if store.set_store_format(expected, StoreFormat(step.to, release)):
            log.info("metastore (rootPath %s) is in format %d", store.root_path, step.to)
        # else another daemon raised it first: read it again
    raise StoreFormatError(
        f"the metastore (rootPath {store.root_path}) did not settle in format {latest}: "
        "other daemons keep changing its format record"
    )


def unready_readers(step: Migration, members: Mapping[str, MemberFormat]) -> list[str]:
    """The members that cannot read the format a breaking ``step`` makes, as the log names
    them."""
    return sorted(
        f"{member} (release {found.release or 'before 0.4.0'}, reads formats to {found.reads})"
        for member, found in members.items()
        if found.reads < step.to
    )


def log_wait(store: MetaStore, step: Migration, behind: list[str]) -> None:
    """Say that ``step`` waits for the members ``behind``."""
    log.warning(
        "metastore (rootPath %s): format %d (%s) waits: fleet member(s) %s cannot read it; "
        "this daemon keeps the store in format %d and tries again",
        store.root_path,
        step.to,
        step.summary,
        ", ".join(behind),
        step.to - 1,
    )
