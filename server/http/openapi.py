"""The OpenAPI 3.1 document served at ``/openapi.json``.

Request bodies come from the same pydantic models that validate them (server/tasks/requests.py);
answers are described here. tests/unit/test_openapi.py pins the document and checks that it
names every route the application serves, so a change to the API shows up as a change to the
pinned file.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from aiohttp import web

from server.tasks.requests import CreateRequest

API_VERSION = "1.0.0"
REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


_NULLABLE_NUMBER = {"type": ["number", "null"]}
_TASK_ID_PARAM = {
    "name": "task_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The task's id",
}
_ERRORS = {
    "400": _problem("Invalid request (the detail names the field)"),
    "503": _problem("Metastore unavailable or the daemon is draining; try again"),
}
_TASK_ERRORS = {**_ERRORS, "404": _problem("No task with this id")}
_CROSS_SITE = {
    "403": _problem(
        "A viewer's token on a change, or a browser request whose Origin is another site"
    )
}
_UNAUTHORIZED = _problem("No valid token; the answer names the scheme (WWW-Authenticate: Bearer)")
# Without auth.tokens, or with auth.allowAnonymous, a request without a token is served.
_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {}]
_OPEN = ("/livez", "/readyz", "/openapi.json", "/")


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
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {
                "202": _json(
                    {
                        "type": "object",
                        "required": ["task", "job_id"],
                        "properties": {"task": _ref("Task"), "job_id": {"type": "string"}},
                    },
                    accepted,
                ),
                **_TASK_ERRORS,
                **_CROSS_SITE,
                "409": _problem(conflict),
            },
        },
    }


_TASK_ANSWER = {"type": "object", "required": ["task"], "properties": {"task": _ref("Task")}}


def _schemas() -> dict[str, Any]:
    create = CreateRequest.model_json_schema(ref_template=REF)
    defs = create.pop("$defs", {})
    channel = {
        "type": "object",
        "properties": {
            "channel": {"type": "string"},
            "state": {"type": "string"},
            "rows": {"type": "integer"},
            "bytes": {"type": "integer"},
            "lag_seconds": _NULLABLE_NUMBER,
            "position": {"type": ["object", "null"]},
        },
    }
    progress = {
        "type": ["object", "null"],
        "description": "The runner's progress while the task runs, and the task's last "
        "verify in any state; null when neither",
        "properties": {
            "rows": {"type": "integer"},
            "bytes": {"type": "integer"},
            "lag_seconds": _NULLABLE_NUMBER,
            "channels": {"type": "array", "items": _ref("ChannelProgress")},
            "verify": {
                "type": "object",
                "description": "The task's last verify job (see Task.verify)",
            },
        },
    }
    task = {
        "type": "object",
        "description": "A task as get and list show it: its specification without secrets, "
        "its state and progress",
        "required": ["task_id", "state", "reason", "created_at", "updated_at", "progress"],
        "properties": {
            "task_id": {"type": "string"},
            "state": {"type": "string", "enum": ["Initial", "Running", "Paused", "Failed"]},
            "reason": {"type": "string", "description": "Why the task is in its state"},
            "created_at": {"type": "number", "description": "Unix time"},
            "updated_at": {"type": "number", "description": "Unix time"},
            "milvus_connect_param": {
                "type": "object",
                "description": "The target Milvus; password and token are never shown",
            },
            "kafka_connect_param": {
                "type": "object",
                "description": "Or the target Kafka topic (README, 'Kafka targets'); the SASL "
                "password is never shown",
            },
            "collection_infos": {"type": "array", "items": {"type": "object"}},
            "db_collections": {"type": "object"},
            "rpc_channel_info": {"type": "object"},
            "name_mapping": {"type": "array", "items": {"type": "object"}},
            "owner": {
                "type": ["string", "null"],
                "description": "The daemon (fleet member id) running the task; null when none "
                "holds it (not Running, or between daemons)",
            },
            "progress": _ref("Progress"),
            "rows_per_second": {
                **_NULLABLE_NUMBER,
                "description": "/v1 only: rows applied per second over the last samples",
            },
            "lag_samples": {
                "type": "array",
                "items": _NULLABLE_NUMBER,
                "description": "/v1 only: recent lag samples in seconds, oldest first",
            },
            "retry": {
                "type": ["object", "null"],
                "description": "/v1 only: automatic resumes after transient failures",
                "properties": {
                    "attempts": {"type": "integer"},
                    "next_at": _NULLABLE_NUMBER,
                    "gave_up": {"type": "boolean"},
                },
            },
            "backfill": {
                "type": ["object", "null"],
                "description": "/v1 only: backfill progress (null: no backfill, or the task is "
                "not running): state (pending, planning, running, done, failed), rows_done, "
                "rows_total, ranges_done, ranges_total, percent, rows_per_second, eta_seconds, "
                "collections, attempts, reason",
            },
            "verify": {
                "type": ["object", "null"],
                "description": "/v1 only: the task's last verify (null: none); the same as "
                "progress.verify: state (pending, running, done, failed), ranges_done, "
                "ranges_total, rows_compared, divergent_rows, repaired, collections (missing, "
                "extra, different: count and up to 100 keys; unsettled ranges), notes, reason",
            },
            "switchover": {
                "type": ["object", "null"],
                "description": "/v1 only: the task's last switchover job (README \"Disaster "
                'recovery"): job_id, state (checking, fencing, draining, verifying, reversing, '
                "done, failed), steps, fence, fenced_at, lifted_at, consistent_up_to, verify, "
                "reverse_task_id, rearm, reason, rolled_back",
            },
            "failover": {
                "type": ["object", "null"],
                "description": "/v1 only: the task's failover: failed_over_at, "
                "consistent_up_to, rpo_seconds, unreplicated (records, by_collection, file, "
                "complete, problems)",
            },
            "failback": {
                "type": ["object", "null"],
                "description": "/v1 only: the task's failback: reverse_task_id, state (creating, "
                "seeding, repairing, streaming, in_sync, failed), steps, repaired, verify, reason",
            },
        },
    }
    position = {
        "type": "object",
        "required": ["channel_name", "backend", "msg_id", "tt", "time"],
        "properties": {
            "channel_name": {"type": "string"},
            "backend": {"type": "string"},
            "msg_id": {"type": "string", "contentEncoding": "base64"},
            "tt": {"type": "integer", "description": "Hybrid timestamp"},
            "time": {"type": "integer", "description": "Physical milliseconds of tt"},
        },
    }
    problem = {
        "type": "object",
        "description": "RFC 9457 problem details",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
    }
    cdc_request = {
        "type": "object",
        "required": ["request_type"],
        "additionalProperties": False,
        "properties": {
            "request_type": {
                "type": "string",
                "enum": [
                    "create",
                    "delete",
                    "pause",
                    "resume",
                    "get",
                    "list",
                    "position",
                    "backfill",
                    "verify",
                    "switchover",
                    "failover",
                    "failback",
                ],
            },
            "request_data": {
                "type": ["object", "null"],
                "description": "create: a CreateRequest; delete: {task_id, ignore_not_found}; "
                "pause, resume, get, position: {task_id}; list: {}; backfill: {task_id, "
                "collections} (ours); verify: {task_id, collections, repair} (ours); "
                "switchover: {task_id, max_lag_seconds, timeout_seconds} (ours); failover: "
                "{task_id, export_seconds} (ours); failback: {task_id} (ours)",
            },
        },
    }
    collections = {
        "type": "array",
        "items": {"type": "string"},
        "default": ["*"],
        "description": "'*' (every collection the task selects) or names: coll (default "
        "database) or db.coll",
    }
    cdc_answer = {
        "type": "object",
        "required": ["code", "message", "data"],
        "properties": {
            "code": {"type": "integer", "description": "Equal to the HTTP status"},
            "message": {"type": "string"},
            "data": {"type": "object"},
        },
    }
    return {
        **defs,
        "CreateRequest": create,
        "Task": task,
        "Progress": progress,
        "ChannelProgress": channel,
        "Position": position,
        "Problem": problem,
        "CdcRequest": cdc_request,
        "BackfillBody": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"collections": collections},
        },
        "VerifyBody": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "collections": collections,
                "repair": {
                    "type": "boolean",
                    "default": False,
                    "description": "upsert missing and different rows from the source, delete "
                    "extra rows on the target",
                },
            },
        },
        "SwitchoverBody": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_lag_seconds": {
                    "type": "number",
                    "default": 30,
                    "description": "refused (409) when the task's lag is above it",
                },
                "timeout_seconds": {
                    "type": "number",
                    "default": 600,
                    "description": "the job rolls back when it has not reversed the flow by then",
                },
                "fence": {
                    "type": "string",
                    "enum": ["etcd", "operator"],
                    "default": "etcd",
                    "description": "etcd: the job stops writes on the source "
                    "(quotaAndLimits.limitWriting.forceDeny in its etcd); operator: the "
                    "operator stopped the writers and the job waits for the WAL to be quiet",
                },
                "stale_check_seconds": {
                    "type": "number",
                    "default": 60,
                    "description": "after done, a verify of the reverse task looks for writes "
                    "of stale clients on the old primary (switchover.stale_check); 0: none",
                },
            },
        },
        "FailoverBody": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "export_seconds": {
                    "type": "number",
                    "default": 60,
                    "description": "how long the export of what the target lacks may read the "
                    "source's WAL (0: no export)",
                },
            },
        },
        "CdcAnswer": cdc_answer,
    }


def _paths() -> dict[str, Any]:
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
                            "properties": {"tasks": {"type": "array", "items": _ref("Task")}},
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
                    "content": {"application/json": {"schema": _ref("CreateRequest")}},
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
                    "409": _problem(
                        "The task id exists, maxTaskNum is reached, or another "
                        "task replicates an overlapping selection to the target"
                    ),
                    "413": _problem("Body larger than maxRequestBytes"),
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
                    "409": _problem("Already Paused"),
                },
            },
        },
        "/v1/tasks/{task_id}/resume": {
            **task_op,
            "post": {
                "operationId": "resumeTask",
                "summary": "Resume a task from its saved positions",
                "responses": {
                    "200": _json(_TASK_ANSWER, "Running (or Failed when it cannot start)"),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": _problem("Already Running"),
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
                                "positions": {"type": "array", "items": _ref("Position")},
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
            'reverse the flow (README "Disaster recovery")',
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
                    "content": {"application/json": {"schema": _ref("FailoverBody")}},
                },
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["task", "consistent_up_to", "unreplicated"],
                            "properties": {
                                "task": _ref("Task"),
                                "consistent_up_to": {"type": ["object", "null"]},
                                "rpo_seconds": _NULLABLE_NUMBER,
                                "unreplicated": {"type": ["object", "null"]},
                            },
                        },
                        "Failed over; the task is Paused",
                    ),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": _problem("A switchover of the task is under way"),
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
                                "task": _ref("Task"),
                                "reverse_task_id": {"type": "string"},
                                "failback": {"type": "object"},
                            },
                        },
                        "Failback started; its steps are under task.failback",
                    ),
                    **_TASK_ERRORS,
                    **_CROSS_SITE,
                    "409": _problem("The task did not fail over, or a failback is under way"),
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
                    "content": {"application/json": {"schema": _ref("CdcRequest")}},
                },
                "responses": {
                    str(code): _json(_ref("CdcAnswer"), text)
                    for code, text in [
                        (200, "Done"),
                        (400, "Invalid request"),
                        (404, "Unknown task"),
                        (401, "No valid token (WWW-Authenticate: Bearer)"),
                        (403, "The token's role may not take this request_type"),
                        (405, "Not POST"),
                        (409, "State conflict"),
                        (413, "Body too large"),
                        (503, "Metastore unavailable or draining"),
                    ]
                },
            }
        },
        "/livez": {
            "get": {
                "operationId": "livez",
                "summary": "The process answers",
                "responses": {"200": _json({"type": "object"}, "Alive")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Ready to serve: not draining, the metastore answers, and the key "
                "ring holds every key the stored secrets are encrypted with",
                "responses": {
                    "200": _json({"type": "object"}, "Ready"),
                    "503": _json(
                        {"type": "object"},
                        "Draining, the metastore is down, or keys are missing (the reason and "
                        "missing_keys name their ids)",
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


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation but health, this document and the dashboard's page asks for a token
    (server/http/auth.py); the /v1 ones answer 401 as a problem."""
    for path, item in paths.items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            operation["security"] = [] if path in _OPEN else _SECURITY
            if path.startswith("/v1/"):
                operation["responses"]["401"] = _UNAUTHORIZED
    return paths


@functools.cache
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "milvus-cdc",
            "version": API_VERSION,
            "description": "Change-data-capture daemon for Milvus: replication tasks over REST "
            "(/v1) or the Go milvus-cdc protocol (POST /cdc).",
        },
        "paths": _secured(_paths()),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An auth.tokens token: admin for changes, viewer for reads",
                }
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    return copy.deepcopy(_document())


async def openapi_endpoint(request: web.Request) -> web.Response:
    return web.json_response(_document())
