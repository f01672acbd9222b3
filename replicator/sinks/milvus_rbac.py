"""Users, roles, grants and privilege groups on a target Milvus, through any MilvusService call."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

from pymilvus.grpc_gen import milvus_pb2

# one MilvusService call: (method, request, what it does for the error message) -> its reply
Call = Callable[[str, Any, str], Any]


class TargetRbac:
    """The RBAC calls of a target; ``call`` is its connection's (so a fence and errors apply)."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def list_users(self) -> list[str]:
        response = self._call("ListCredUsers", milvus_pb2.ListCredUsersRequest(), "list users")
        return list(response.usernames)

    def create_user(self, user: str, password: str) -> None:
        """``password`` is sent base64-encoded as the API wants; never logged."""
        encoded = base64.b64encode(password.encode()).decode()
        self._call(
            "CreateCredential",
            milvus_pb2.CreateCredentialRequest(username=user, password=encoded),
            f"create user {user}",
        )

    def drop_user(self, user: str) -> None:
        self._call(
            "DeleteCredential",
            milvus_pb2.DeleteCredentialRequest(username=user),
            f"drop user {user}",
        )

    def list_roles(self) -> list[str]:
        response = self._call("SelectRole", milvus_pb2.SelectRoleRequest(), "list roles")
        return [r.role.name for r in response.results]

    def create_role(self, role: str) -> None:
        self._call(
            "CreateRole",
            milvus_pb2.CreateRoleRequest(entity=milvus_pb2.RoleEntity(name=role)),
            f"create role {role}",
        )

    def drop_role(self, role: str, *, force: bool = False) -> None:
        self._call(
            "DropRole",
            milvus_pb2.DropRoleRequest(role_name=role, force_drop=force),
            f"drop role {role}",
        )

    def operate_user_role(self, user: str, role: str, *, add: bool) -> None:
        self._call(
            "OperateUserRole",
            milvus_pb2.OperateUserRoleRequest(
                username=user,
                role_name=role,
                type=milvus_pb2.AddUserToRole if add else milvus_pb2.RemoveUserFromRole,
            ),
            f"{'bind' if add else 'unbind'} user {user} and role {role}",
        )

    def operate_privilege(self, entity: milvus_pb2.GrantEntity, *, grant: bool) -> None:
        privilege = entity.grantor.privilege.name
        self._call(
            "OperatePrivilege",
            milvus_pb2.OperatePrivilegeRequest(
                entity=entity, type=milvus_pb2.Grant if grant else milvus_pb2.Revoke
            ),
            f"{'grant' if grant else 'revoke'} {privilege} on {entity.object.name} "
            f"{entity.db_name}.{entity.object_name} {'to' if grant else 'from'} "
            f"{entity.role.name}",
        )

    def grants(self, role: str, db: str = "") -> list[Any]:
        """The role's grants in ``db`` (Milvus answers for the default database when none)."""
        response = self._call(
            "SelectGrant",
            milvus_pb2.SelectGrantRequest(
                entity=milvus_pb2.GrantEntity(role=milvus_pb2.RoleEntity(name=role), db_name=db)
            ),
            f"grants of {role} in {db or 'default'}",
        )
        return list(response.entities)

    def privilege_groups(self) -> dict[str, list[str]]:
        response = self._call(
            "ListPrivilegeGroups", milvus_pb2.ListPrivilegeGroupsRequest(), "privilege groups"
        )
        return {g.group_name: [p.name for p in g.privileges] for g in response.privilege_groups}

    def create_privilege_group(self, group: str) -> None:
        self._call(
            "CreatePrivilegeGroup",
            milvus_pb2.CreatePrivilegeGroupRequest(group_name=group),
            f"create privilege group {group}",
        )

    def drop_privilege_group(self, group: str) -> None:
        self._call(
            "DropPrivilegeGroup",
            milvus_pb2.DropPrivilegeGroupRequest(group_name=group),
            f"drop privilege group {group}",
        )

    def operate_privilege_group(self, group: str, privileges: Sequence[str], *, add: bool) -> None:
        self._call(
            "OperatePrivilegeGroup",
            milvus_pb2.OperatePrivilegeGroupRequest(
                group_name=group,
                privileges=[milvus_pb2.PrivilegeEntity(name=p) for p in privileges],
                type=(
                    milvus_pb2.AddPrivilegesToGroup if add else milvus_pb2.RemovePrivilegesFromGroup
                ),
            ),
            f"{'add' if add else 'remove'} privileges {list(privileges)} of group {group}",
        )

    def restore_rbac(self, meta: milvus_pb2.RBACMeta) -> None:
        self._call("RestoreRBAC", milvus_pb2.RestoreRBACMetaRequest(RBAC_meta=meta), "restore RBAC")


__all__ = ["Call", "TargetRbac"]
