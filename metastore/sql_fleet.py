"""The fleet's part of the SQL metastore (:mod:`metastore.sql`): members and task leases.

``cdc_members`` and ``cdc_leases`` rows carry an expiry on the database server's clock
(MySQL's ``NOW(6)``; the daemons' clocks may disagree, the server's is one), extended by every
heartbeat of their member. A lease taken (a new owner, or the same after it expired) gets a
token greater than every earlier one of the task (and than the milliseconds since the epoch, so
a task deleted and created again does not reuse its predecessor's tokens). A write under a lease
reads the lease row in its own transaction (:class:`SqlPlumbing`) and is refused unless the
token is the live one's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from sqlalchemy import and_, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from metastore.base import Lease, Member
from metastore.errors import TaskNotFoundError
from metastore.sql_plumbing import SqlPlumbing
from metastore.sql_schema import leases_table, members_table


class SqlFleet(SqlPlumbing):
    """Members' heartbeats and task leases."""

    # --- the fleet ---------------------------------------------------------------------------
    def heartbeat(self, member_id: str, info: Mapping[str, Any], ttl: float) -> None:
        member = and_(
            members_table.c.root_path == self.root_path, members_table.c.member_id == member_id
        )
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            values = {"info": json.dumps(dict(info), sort_keys=True), "expires_at": now + ttl}
            if conn.execute(update(members_table).where(member).values(**values)).rowcount == 0:
                conn.execute(
                    insert(members_table).values(
                        root_path=self.root_path, member_id=member_id, **values
                    )
                )
            # read without locks, then extend each lease by its key: an UPDATE filtered on
            # owner would lock every lease row it scans (InnoDB), and wait on, or hold up, the
            # other members' position writes that lock their own lease rows
            held = conn.execute(
                select(leases_table.c.task_id, leases_table.c.token).where(
                    leases_table.c.root_path == self.root_path,
                    leases_table.c.owner == member_id,
                    leases_table.c.expires_at > now,
                )
            ).all()
            if held:  # one statement for all (executemany): fifty tasks, fifty rows a second
                extend = (
                    update(leases_table)
                    .where(
                        leases_table.c.root_path == self.root_path,
                        leases_table.c.task_id == bindparam("held_task"),
                        leases_table.c.token == bindparam("held_token"),
                        leases_table.c.expires_at > now,
                    )
                    .values(expires_at=now + ttl)
                )
                conn.execute(
                    extend, [{"held_task": r.task_id, "held_token": r.token} for r in held]
                )

    def leave(self, member_id: str) -> None:
        with self._tx(fleet=True) as conn:
            for table, column in (
                (leases_table, leases_table.c.owner),
                (members_table, members_table.c.member_id),
            ):
                conn.execute(
                    delete(table).where(table.c.root_path == self.root_path, column == member_id)
                )

    def members(self) -> list[Member]:
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                select(members_table.c.member_id, members_table.c.info)
                .where(members_table.c.root_path == self.root_path)
                .where(members_table.c.expires_at > now)
                .order_by(members_table.c.member_id)
            ).all()
        return [Member(row.member_id, orjson.loads(row.info)) for row in rows]

    def acquire_lease(self, task_id: str, member_id: str, ttl: float) -> Lease | None:
        try:
            with self._tx(fleet=True) as conn:
                if not self._lock_task(conn, task_id):
                    raise TaskNotFoundError(task_id)
                now = self._now(conn)
                row = self._lease_row(conn, task_id)
                values = {"owner": member_id, "expires_at": now + ttl}
                if row is None:
                    token = int(now * 1000)
                    conn.execute(
                        insert(leases_table).values(
                            root_path=self.root_path, task_id=task_id, token=token, **values
                        )
                    )
                    return Lease(task_id, member_id, token)
                if row.expires_at > now:
                    return Lease(task_id, member_id, row.token) if row.owner == member_id else None
                token = max(row.token + 1, int(now * 1000))
                conn.execute(
                    update(leases_table)
                    .where(self._lease_key(task_id), leases_table.c.token == row.token)
                    .values(token=token, **values)
                )
                return Lease(task_id, member_id, token)
        except IntegrityError:  # another member inserted the first lease at the same moment
            return None

    def release_lease(self, lease: Lease) -> None:
        with self._tx(fleet=True) as conn:
            conn.execute(
                delete(leases_table).where(
                    self._lease_key(lease.task_id), leases_table.c.token == lease.token
                )
            )

    def leases(self) -> dict[str, Lease]:
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                select(leases_table.c.task_id, leases_table.c.owner, leases_table.c.token)
                .where(leases_table.c.root_path == self.root_path)
                .where(leases_table.c.expires_at > now)
            ).all()
        return {row.task_id: Lease(row.task_id, row.owner, row.token) for row in rows}
