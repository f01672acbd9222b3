"""2.6 RBAC on the target (only when the task sets ``extra_info.enable_user_role``): users,
roles, bindings, grants, privilege groups, RestoreRBAC.

The source's WAL holds only a bcrypt hash of a user's password (see ``streaming_ddl``), which
the public API cannot take: a new user is created on the target with a random password the
daemon never logs or stores (so the user exists for its roles, and an operator sets the
password on the target); a password change is a no-op with a warning.
"""

from __future__ import annotations

import logging
import secrets

from replicator.codec import streaming_ddl_ops as ddl
from replicator.errors import TargetRejectedError
from replicator.pipeline.ddl_outcome import ABSENT, EXISTS, Outcome, attempt, combine, unsupported
from replicator.pipeline.names import TaskNames
from replicator.sinks.milvus import MilvusTarget

log = logging.getLogger(__name__)


class RbacDdl:
    def __init__(self, target: MilvusTarget, names: TaskNames) -> None:
        self.target = target
        self.names = names

    def alter_user(self, op: ddl.AlterUser) -> Outcome:
        try:
            users = self.target.rbac.list_users()
        except TargetRejectedError as exc:
            if unsupported(exc):
                return Outcome("skipped", f"user {op.user}: the target has no users")
            raise
        if op.user in users:
            return Outcome(
                "skipped" if op.had_password_hash else "unchanged",
                f"user {op.user} exists; the source's password cannot be replicated (the WAL "
                "holds only its hash): set it on the target",
            )
        outcome = attempt(
            f"create user {op.user}",
            lambda: self.target.rbac.create_user(op.user, _unusable_password()),
            done_if=EXISTS,
        )
        if outcome.status == "applied":
            log.warning(
                "user %s created on the target with a random password: set its password there",
                op.user,
            )
        return outcome

    def drop_user(self, op: ddl.DropUser) -> Outcome:
        return attempt(
            f"drop user {op.user}",
            lambda: self.target.rbac.drop_user(op.user),
            done_if=ABSENT,
        )

    def alter_role(self, op: ddl.AlterRole) -> Outcome:
        return attempt(
            f"create role {op.role}",
            lambda: self.target.rbac.create_role(op.role),
            done_if=EXISTS,
        )

    def drop_role(self, op: ddl.DropRole) -> Outcome:
        return attempt(
            f"drop role {op.role}",
            lambda: self.target.rbac.drop_role(op.role, force=op.force),
            done_if=ABSENT,
        )

    def user_role(self, op: ddl.UserRole) -> Outcome:
        verb = "bind" if op.grant else "unbind"
        return attempt(
            f"{verb} user {op.user} and role {op.role}",
            lambda: self.target.rbac.operate_user_role(op.user, op.role, add=op.grant),
            done_if=EXISTS if op.grant else ABSENT,
        )

    def privilege(self, op: ddl.Privilege) -> Outcome:
        entity = op.entity
        db = self.names.database(entity.db_name or "default") if entity.db_name != "*" else "*"
        if db is None:
            return Outcome("not_selected", f"privilege on {entity.db_name}")
        mapped = type(entity)()
        mapped.CopyFrom(entity)
        mapped.db_name = db
        if entity.object.name == "Collection" and entity.object_name not in ("", "*"):
            mapped.object_name = self.names.collection_name(entity.db_name, entity.object_name)
        verb = "grant" if op.grant else "revoke"
        return attempt(
            f"{verb} {entity.grantor.privilege.name} on {db}.{mapped.object_name} "
            f"for {entity.role.name}",
            lambda: self.target.rbac.operate_privilege(mapped, grant=op.grant),
            done_if=EXISTS | ABSENT,
        )

    def privilege_group(self, op: ddl.PrivilegeGroup) -> Outcome:
        try:
            groups = self.target.rbac.privilege_groups()
        except TargetRejectedError as exc:
            if unsupported(exc):
                return Outcome("skipped", f"privilege group {op.group}: not offered")
            raise
        if op.drop and not op.privileges:
            if op.group not in groups:
                return Outcome("unchanged", f"privilege group {op.group} is absent")
            return attempt(
                f"drop privilege group {op.group}",
                lambda: self.target.rbac.drop_privilege_group(op.group),
            )
        outcomes = []
        if op.group not in groups and not op.drop:
            outcomes.append(
                attempt(
                    f"create privilege group {op.group}",
                    lambda: self.target.rbac.create_privilege_group(op.group),
                    done_if=EXISTS,
                )
            )
        have = set(groups.get(op.group, []))
        todo = [p for p in op.privileges if (p in have) == op.drop]
        if todo:
            outcomes.append(
                attempt(
                    f"{'remove' if op.drop else 'add'} {todo} of group {op.group}",
                    lambda: self.target.rbac.operate_privilege_group(
                        op.group, todo, add=not op.drop
                    ),
                )
            )
        return combine(outcomes or [Outcome("unchanged", op.group)], f"group {op.group}")

    def restore_rbac(self, op: ddl.RestoreRBAC) -> Outcome:
        meta = type(op.meta)()
        meta.CopyFrom(op.meta)
        for user in meta.users:  # the source's hashes are no passwords for the target
            user.password = ""
        return attempt("restore RBAC", lambda: self.target.rbac.restore_rbac(meta))


def _unusable_password() -> str:
    """A password nobody knows (never logged or stored): the user exists for its roles and
    grants until an operator sets one on the target."""
    return secrets.token_urlsafe(24)[:30] + "aA1!"
