"""The component schemas of the OpenAPI document: the tasks, their jobs and the answers.

Request bodies come from the same pydantic models that validate them (server/tasks/requests.py);
the answers are described here.
"""

from __future__ import annotations

from typing import Any

from server.tasks.requests import CreateRequest

REF = "#/components/schemas/{model}"
NULLABLE_NUMBER = {"type": ["number", "null"]}


def ref(name: str) -> dict[str, str]:
    """A reference to the component schema ``name``."""
    return {"$ref": REF.format(model=name)}


def component_schemas() -> dict[str, Any]:
    """``components.schemas``: every schema the paths refer to by name."""
    create = CreateRequest.model_json_schema(ref_template=REF)
    defs = create.pop("$defs", {})
    channel = {
        "type": "object",
        "properties": {
            "channel": {"type": "string"},
            "state": {"type": "string"},
            "rows": {"type": "integer"},
            "bytes": {"type": "integer"},
            "lag_seconds": NULLABLE_NUMBER,
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
            "lag_seconds": NULLABLE_NUMBER,
            "channels": {"type": "array", "items": ref("ChannelProgress")},
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
                "description": "Or the target Kafka topic (docs/guides/kafka-target.md); the SASL "
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
            "progress": ref("Progress"),
            "rows_per_second": {
                **NULLABLE_NUMBER,
                "description": "/v1 only: rows applied per second over the last samples",
            },
            "lag_samples": {
                "type": "array",
                "items": NULLABLE_NUMBER,
                "description": "/v1 only: recent lag samples in seconds, oldest first",
            },
            "retry": {
                "type": ["object", "null"],
                "description": "/v1 only: automatic resumes after transient failures",
                "properties": {
                    "attempts": {"type": "integer"},
                    "next_at": NULLABLE_NUMBER,
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
                "description": "/v1 only: the task's last switchover job "
                "(docs/concepts/disaster-recovery.md): job_id, state (checking, fencing, "
                "draining, verifying, reversing, "
                "done, failed), steps, fence, fenced_at, lifted_at, consistent_up_to, verify, "
                "reverse_task_id, rearm, reason, rolled_back",
            },
            "failover": {
                "type": ["object", "null"],
                "description": "/v1 only: the task's failover: failed_over_at, "
                "consistent_up_to, rpo_seconds, unapplied_from, complete, unreplicated "
                "(records, wal_records, by_collection, unapplied_from, file, channels, "
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
                "pause, get, position: {task_id}; resume: {task_id, milvus_connect_param "
                "(ours: new credentials, as ResumeBody)}; list: {}; backfill: {task_id, "
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
        "ResumeBody": {
            "type": "object",
            "additionalProperties": False,
            "description": "ours: the target Milvus's new credentials (a password or token "
            "rotated, TLS files moved); tried on the target first; a Running task is paused "
            "for them and goes on from its positions",
            "properties": {
                "milvus_connect_param": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "username": {"type": "string"},
                        "password": {"type": "string", "writeOnly": True},
                        "token": {"type": "string", "writeOnly": True},
                        "dial_config": ref("DialConfig"),
                    },
                },
            },
        },
        "CdcAnswer": cdc_answer,
    }
