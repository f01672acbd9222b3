"""The paths of the OpenAPI document, with their answers and errors.

The /v1 REST resources, ``POST /cdc``, and the health, document and dashboard routes.
"""

from __future__ import annotations

from typing import Any

from server.http.openapi_schemas import NULLABLE_NUMBER, ref


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def problem_answer(description: str) -> dict[str, Any]:
    """An answer of ``application/problem+json`` with this description."""
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": ref("Problem")}},
    }


_TASK_ID_PARAM = {
    "name": "task_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The task's id",
}
_ERRORS = {
    "400": problem_answer("Invalid request (the detail names the field)"),
    "503": problem_answer(
        "Metastore unavailable, or the daemon is starting or draining; try again "
        "(Retry-After says when)"
    ),
}
_TASK_ERRORS = {**_ERRORS, "404": problem_answer("No task with this id")}
_CROSS_SITE = {
    "403": problem_answer(
        "A viewer's token on a change, or a browser request whose Origin is another site"
    )
}


def _job_operation(
    task_op: dict[str, Any],
    operation_id: str,
    summary: str,
    body: str,
    accepted: str,
    conflict: str,
) -> dict[str, Any]:
    """A POST that starts a job of a task (backfill, verify): 202 with the task and job id."""
    return {
        **task_op,
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": ref(body)}},
            },
            "responses": {
                "202": _json(
                    {
                        "type": "object",
                        "required": ["task", "job_id"],
                        "properties": {"task": ref("Task"), "job_id": {"type": "string"}},
                    },
                    accepted,
                ),
                **_TASK_ERRORS,
                **_CROSS_SITE,
                "409": problem_answer(conflict),
            },
        },
    }


_TASK_ANSWER = {"type": "object", "required": ["task"], "properties": {"task": ref("Task")}}


def path_items() -> dict[str, Any]:
    """``paths``: every route the application serves, without its security."""
    task_op = {"parameters": [_TASK_ID_PARAM]}
    return {
        "/v1/fleet": {
            "get": {
                "operationId": "fleet",
                "summary": "This daemon and the others sharing its metastore, with the number of "
                "Running tasks each runs (as of the last ownership round)",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["member_id", "members"],
                            "properties": {
                                "member_id": {"type": "string"},
                                "lease_seconds": {"type": "number"},
                                "renewed": {"type": "boolean"},
                                "lease_seconds_left": {"type": "number"},
                                "members": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "member_id": {"type": "string"},
                                            "address": {"type": ["string", "null"]},
                                            "release": {"type": ["string", "null"]},
                                            "store_format": {"type": ["integer", "null"]},
                                            "tasks": {"type": "integer"},
                                            "self": {"type": "boolean"},
                                        },
                                    },
                                },
                            },
                        },
                        "The fleet",
                    ),
                },
            },
        },
        "/v1/tasks": {
            "get": {
                "operationId": "listTasks",
                "summary": "List the tasks",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["tasks"],
                            "properties": {"tasks": {"type": "array", "items": ref("Task")}},
                        },
                        "Every task",
                    ),
                    "503": _ERRORS["503"],
                },
            },
            "post": {
                "operationId": "createTask",
                "summary": "Create a task (the target must answer first)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("CreateRequest")}},
                },
                "responses": {
                    "201": {
                        **_json(_TASK_ANSWER, "Created"),
                        "headers": {
                            "Location": {
                                "schema": {"type": "string"},
                                "description": "/v1/tasks/{task_id}",
                            }
                        },
                    },
                    **_ERRORS,
                    **_CROSS_SITE,
                    "409": problem_answer(
                        "The task id exists, maxTaskNum is reached, or another "
                        "task replicates an overlapping selection to the target"
                    ),
                    "413": problem_answer("Body larger than maxRequestBytes"),
                },
            },
        },
        "/v1/tasks/{task_id}": {
            **task_op,
            "get": {
                "operationId": "getTask",
                "summary": "One task with its progress",
                "responses": {"200": _json(_TASK_ANSWER, "The task"), **_TASK_ERRORS},
            },
            "delete": {
                "operationId": "deleteTask",
                "summary": "Stop and delete a task",
                "responses": {"204": {"description": "Deleted"}, **_TASK_ERRORS, **_CROSS_SITE},
            },
        },
        "/v1/tasks/{task_id}/pause": {
            **task_op,
            "post": {
                "operationId": "pauseTask",
                "summary": "Pause a task (its runner stops and saves its positions)",
                "responses": {
                    "200": _json(_TASK_ANSWER, "Paused"),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": problem_answer("Already Paused"),
                },
            },
        },
        "/v1/tasks/{task_id}/resume": {
            **task_op,
            "post": {
                "operationId": "resumeTask",
                "summary": "Resume a task from its saved positions (with the target's new "
                "credentials, when given)",
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": ref("ResumeBody")}},
                },
                "responses": {
                    "200": _json(_TASK_ANSWER, "Running (or Failed when it cannot start)"),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "400": problem_answer(
                        "Credentials that cannot be taken, or that the target refuses (named)"
                    ),
                    "409": problem_answer("Already Running"),
                },
            },
        },
        "/v1/tasks/{task_id}/positions": {
            **task_op,
            "get": {
                "operationId": "taskPositions",
                "summary": "The task's saved position on each channel",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["task_id", "positions"],
                            "properties": {
                                "task_id": {"type": "string"},
                                "positions": {"type": "array", "items": ref("Position")},
                            },
                        },
                        "Positions by channel name",
                    ),
                    **_TASK_ERRORS,
                },
            },
        },
        "/v1/tasks/{task_id}/history": {
            **task_op,
            "get": {
                "operationId": "taskHistory",
                "summary": "The task's lag and rows/s over the last hour, sampled by the daemon "
                "(what the dashboard's charts draw), and its last state and owner changes",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["task_id", "samples"],
                            "properties": {
                                "task_id": {"type": "string"},
                                "interval_seconds": {"type": ["number", "null"]},
                                "window_seconds": {"type": "number"},
                                "samples": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "at": {"type": "number"},
                                            "lag_seconds": {"type": ["number", "null"]},
                                            "rows_per_second": {"type": ["number", "null"]},
                                            "channels": {
                                                "type": "object",
                                                "additionalProperties": {
                                                    "type": ["number", "null"]
                                                },
                                            },
                                        },
                                    },
                                },
                                "states": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "at": {"type": "number"},
                                            "kind": {"type": "string", "enum": ["state", "owner"]},
                                            "from": {"type": ["string", "null"]},
                                            "to": {"type": "string"},
                                            "reason": {"type": "string"},
                                            "by": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                        "Samples and changes, oldest first",
                    ),
                    **_TASK_ERRORS,
                },
            },
        },
        "/v1/tasks/{task_id}/backfill": _job_operation(
            task_op,
            "backfillTask",
            "Copy the rows the source already holds, then stream again from the saved "
            "positions (a Running task stops its workers for the copy)",
            "BackfillBody",
            "Backfill asked; its progress is under task.backfill (job_id)",
            "A backfill of the task is under way",
        ),
        "/v1/tasks/{task_id}/verify": _job_operation(
            task_op,
            "verifyTask",
            "Compare the target with the source key range by key range (and repair it when "
            "asked); the result is under task.verify",
            "VerifyBody",
            "Verify started; its progress and result are under task.verify",
            "A verify of the task is running",
        ),
        "/v1/tasks/{task_id}/switchover": _job_operation(
            task_op,
            "switchoverTask",
            "Move production to the task's target cluster: fence the source, drain, verify, "
            "reverse the flow (docs/concepts/disaster-recovery.md)",
            "SwitchoverBody",
            "Switchover started; its steps are under task.switchover (job_id)",
            "Refused, nothing changed: lag above max_lag_seconds, a target that is not a named "
            "cluster, a task not Running here, or a switchover under way",
        ),
        "/v1/tasks/{task_id}/failover": {
            **task_op,
            "post": {
                "operationId": "failoverTask",
                "summary": "The source is lost: stop the task at once, answer what the target "
                "holds (consistent_up_to) and export what it lacks",
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": ref("FailoverBody")}},
                },
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["task", "consistent_up_to", "unreplicated"],
                            "properties": {
                                "task": ref("Task"),
                                "consistent_up_to": {"type": ["object", "null"]},
                                "rpo_seconds": NULLABLE_NUMBER,
                                "unapplied_from": {"type": ["object", "null"]},
                                "complete": {"type": "boolean"},
                                "unreplicated": {"type": ["object", "null"]},
                            },
                        },
                        "Failed over; the task is Paused",
                    ),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": problem_answer("A switchover of the task is under way"),
                },
            },
        },
        "/v1/tasks/{task_id}/failback": {
            **task_op,
            "post": {
                "operationId": "failbackTask",
                "summary": "Re-seed a failed-over task's old source from its target: the "
                "reverse task with a backfill, a repair, a verify (task.failback)",
                "responses": {
                    "202": _json(
                        {
                            "type": "object",
                            "required": ["task", "reverse_task_id", "failback"],
                            "properties": {
                                "task": ref("Task"),
                                "reverse_task_id": {"type": "string"},
                                "failback": {"type": "object"},
                            },
                        },
                        "Failback started; its steps are under task.failback",
                    ),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": problem_answer("The task did not fail over, or a failback is under way"),
                },
            },
        },
        "/cdc": {
            "post": {
                "operationId": "cdc",
                "summary": "The Go milvus-cdc protocol: one endpoint, request_type selects the "
                "verb; the answer's code equals the HTTP status",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("CdcRequest")}},
                },
                "responses": {
                    str(code): _json(ref("CdcAnswer"), text)
                    for code, text in [
                        (200, "Done"),
                        (400, "Invalid request"),
                        (404, "Unknown task"),
                        (401, "No valid token (WWW-Authenticate: Bearer)"),
                        (403, "The token's role may not take this request_type"),
                        (405, "Not POST"),
                        (409, "State conflict"),
                        (413, "Body too large"),
                        (503, "Metastore unavailable, or the daemon is starting or draining"),
                    ]
                },
            }
        },
        "/livez": {
            "get": {
                "operationId": "livez",
                "summary": "The process answers, naming its release and the store format it writes",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["status", "release", "store_format"],
                            "properties": {
                                "status": {"const": "ok"},
                                "release": {"type": "string"},
                                "store_format": {"type": "integer"},
                            },
                        },
                        "Alive",
                    )
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Ready to serve: not draining, the metastore answers, its format is "
                "one this release reads, and the key ring holds every key the stored secrets "
                "are encrypted with",
                "responses": {
                    "200": _json({"type": "object"}, "Ready"),
                    "503": _json(
                        {"type": "object"},
                        "Starting, draining, the metastore is down or in a format this release "
                        "does not read, or keys are missing (the reason and missing_keys name "
                        "their ids)",
                    ),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (a token is asked with auth.protectMetrics)",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": {"description": "No valid token, with auth.protectMetrics"},
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
            }
        },
        "/": {
            "get": {
                "operationId": "dashboard",
                "summary": "The dashboard (HTML)",
                "responses": {
                    "200": {
                        "description": "The dashboard page",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
