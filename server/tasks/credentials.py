"""New credentials for a task's target, given at ``resume``: a password changed on the target
Milvus, a token replaced, the TLS files moved. The task keeps its id, its positions and its
target's address; only the credentials in its stored ``milvus_connect_param`` change (sealed as
at create), after the target has let the daemon in with them.

The Go tool's ``resume`` carries ``task_id`` alone; ``milvus_connect_param`` beside it is ours
(a Go client never sends it), so the protocol stays as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from metastore import TaskRecord
from replicator.config.task_spec import MILVUS_PARAM, TaskSpec
from server.errors import BadRequestError
from server.tasks.requests import CredentialsUpdate, MilvusConnectParam
from server.tasks.spec import validate_connect

WHERE = "milvus_connect_param"


def with_credentials(task: TaskRecord, update: CredentialsUpdate) -> dict[str, Any]:
    """The task's stored spec with the target's credentials of ``update`` (a 400 naming the
    problem when the task's target takes none, or the result would not be a valid target)."""
    spec = TaskSpec.of(task)
    if spec.is_kafka:
        raise BadRequestError(
            f"milvus_connect_param: task {task.task_id} writes to a Kafka topic, not a Milvus: "
            "it takes no Milvus credentials"
        )
    if spec.target_cluster:
        raise BadRequestError(
            f"milvus_connect_param: task {task.task_id} writes to clusters."
            f"{spec.target_cluster}, whose credentials are the daemon's configuration: change "
            f"clusters.{spec.target_cluster}.milvus in its file and resume the task without "
            "milvus_connect_param (the file is read again when the target refuses the ones in use)"
        )
    stored: dict[str, Any] = json.loads(json.dumps(_plain(task.spec)))
    param = dict(stored.get(MILVUS_PARAM) or {})
    given = update.model_fields_set
    if given & {"username", "password"}:
        param.update(username=update.username, password=update.password.get_secret_value())
        param["token"] = ""
    if "token" in given:
        param.update(token=update.token.get_secret_value(), username="", password="")
    if "dial_config" in given:
        param["dial_config"] = update.dial_config.model_dump() if update.dial_config else None
    try:
        parsed = MilvusConnectParam.model_validate(param)
    except ValueError as exc:  # a stored document of an earlier release, say
        raise BadRequestError(
            f"milvus_connect_param: the stored target cannot take them: {exc}"
        ) from None
    stored[MILVUS_PARAM] = validate_connect(parsed, WHERE)
    return stored


def _plain(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [_plain(value) for value in node]
    return node


__all__ = ["with_credentials"]
