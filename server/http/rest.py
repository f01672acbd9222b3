"""REST resources over the same task supervisor as ``POST /cdc``:

    GET    /v1/tasks                     200 {"tasks": [task, ...]}
    POST   /v1/tasks                     201 {"task": task}, Location: /v1/tasks/{id}
                                         (body: the create request_data of POST /cdc)
    GET    /v1/tasks/{task_id}           200 {"task": task}
    DELETE /v1/tasks/{task_id}           204
    POST   /v1/tasks/{task_id}/pause     200 {"task": task}   (409 when already Paused)
    POST   /v1/tasks/{task_id}/resume    200 {"task": task}   (409 when already Running)
    GET    /v1/tasks/{task_id}/positions 200 {"task_id": ..., "positions": [...]}
    GET    /v1/tasks/{task_id}/history   200 {"task_id", "interval_seconds", "window_seconds",
                                         "samples": [{"at", "lag_seconds", "rows_per_second",
                                         "channels": {channel: lag}}, ...] (the last hour),
                                         "states": [{"at", "kind", "from", "to", "reason",
                                         "by"}, ...] (the last 50 state and owner changes)}
    GET    /v1/fleet                     200 {"member_id", "lease_seconds", "renewed",
                                         "lease_seconds_left", "members": [{"member_id",
                                         "address", "tasks", "self"}, ...]}
    POST   /v1/tasks/{task_id}/backfill  202 {"task": task, "job_id": ...}
                                         (body: {"collections": ["*"]}, optional; 409 while
                                         a backfill of the task is under way)
    POST   /v1/tasks/{task_id}/verify    202 {"task": task, "job_id": ...}
                                         (body: {"collections": ["*"], "repair": false},
                                         optional; 409 while a verify of the task runs)
    POST   /v1/tasks/{task_id}/switchover
                                         202 {"task": task, "job_id": ..., "switchover": job}
                                         (body: {"max_lag_seconds": 30, "timeout_seconds":
                                         600}, optional; 409 refused, nothing changed)
    POST   /v1/tasks/{task_id}/failover  200 {"task": task, "consistent_up_to": ...,
                                         "unreplicated": ...} (body: {"export_seconds": 60})
    POST   /v1/tasks/{task_id}/failback  202 {"task": task, "reverse_task_id": ...,
                                         "failback": job} (409 unless the task failed over)

Failures answer ``application/problem+json`` (RFC 9457): ``{"type", "title", "status",
"detail"}``: 400 invalid request, 401 no valid token (with ``WWW-Authenticate: Bearer``), 403 a
viewer's token on a change, or a browser request from another site's page (its ``Origin``
is not this daemon: the dashboard's buttons must not be pressable by other sites), 404 unknown
task, 405, 409 state conflict, 413, 503 metastore down or daemon draining.

A task is the view of ``get``/``list`` (never a secret) plus what the scheduled jobs know:
``rows_per_second``, ``lag_samples``, ``retry``; ``backfill``: the progress of the task's
backfill (null when it has none, or while the task is not running); ``verify``: the task's
last verify job (null when it has none); ``switchover``, ``failover`` and ``failback``: the
task's last disaster-recovery jobs (README "Disaster recovery").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from metastore import TaskRecord
from server.app_state import AUTH, DISASTER, LIFECYCLE, METRICS, SETTINGS, STORE, SUPERVISOR
from server.dr.failbacks import FailbackRequest
from server.dr.failover import FailoverRequest
from server.dr.manager import DisasterRecovery, SwitchoverRequest
from server.errors import BadRequestError, UnavailableError
from server.http.auth import Principal, audit, challenge
from server.http.common import failure_answer, positions_view, read_json
from server.runtime.jobs import HISTORY_SECONDS, JOBS
from server.tasks import state_history
from server.tasks.requests import (
    BackfillRequest,
    CreateRequest,
    ResumeBody,
    TaskIdRequest,
    VerifyRequest,
    parse_model,
)
from server.tasks.supervisor import task_view

PREFIX = "/v1"
PROBLEM_TYPE = "application/problem+json"

Resource = Callable[[web.Request], Awaitable[web.Response]]


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


def problem(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    return web.Response(
        body=orjson.dumps(body), status=status, content_type=PROBLEM_TYPE, headers=headers
    )


def rest_view(request: web.Request, task: TaskRecord, owners: Mapping[str, str]) -> dict[str, Any]:
    """``owners``: the fleet member holding each task (``TaskSupervisor.owners``)."""
    view = task_view(task, request.app[SUPERVISOR].progress(task.task_id), owners.get(task.task_id))
    jobs = request.app.get(JOBS)
    extras = jobs.task_extras(task.task_id) if jobs is not None else {}
    return {
        **view,
        "rows_per_second": extras.get("rows_per_second"),
        "lag_samples": extras.get("lag_samples", []),
        "retry": extras.get("retry"),
        "backfill": (view["progress"] or {}).get("backfill"),
        "verify": (view["progress"] or {}).get("verify"),
        "switchover": (view["progress"] or {}).get("switchover"),
        "failover": (view["progress"] or {}).get("failover"),
        "failback": (view["progress"] or {}).get("failback"),
    }


async def one_view(request: web.Request, task: TaskRecord) -> dict[str, Any]:
    return rest_view(request, task, await request.app[SUPERVISOR].owners())


def _task_id(request: web.Request) -> str:
    return parse_model(TaskIdRequest, {"task_id": request.match_info["task_id"]}, "path").task_id


def _cross_site(request: web.Request) -> bool:
    """A browser request made by another site's page (a form posting to pause, say): its
    ``Origin`` names another host. Clients that are not browsers send no ``Origin``."""
    origin = request.headers.get("Origin")
    if request.method in ("GET", "HEAD") or origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower()


def resource(verb: str) -> Callable[[Resource], Resource]:
    """Common answer handling: cross-site refusal, the caller's token and role, draining,
    failures as problems, request metrics under ``verb``, the audit line."""

    def wrap(handler: Resource) -> Resource:
        async def run(request: web.Request) -> web.Response:
            started = time.perf_counter()
            status = 500
            principal: Principal | None = None
            try:
                if _cross_site(request):
                    status = 403
                    return problem(403, "cross-site request refused: Origin is not this daemon")
                principal = request.app[AUTH].authorize(request, verb)
                if request.app[LIFECYCLE].draining:
                    raise UnavailableError("the daemon is shutting down")
                response = await handler(request)
                status = response.status
                return response
            except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
                status, detail = failure_answer(exc, verb)
                return problem(status, detail, challenge(exc))
            finally:
                request.app[METRICS].observe_request(verb, status, time.perf_counter() - started)
                audit(request, principal, verb, status)

        return run

    return wrap


@resource("list")
async def list_tasks(request: web.Request) -> web.Response:
    tasks = await request.app[SUPERVISOR].list()
    owners = await request.app[SUPERVISOR].owners()
    return json_response({"tasks": [rest_view(request, t, owners) for t in tasks]})


@resource("create")
async def create_task(request: web.Request) -> web.Response:
    data = await read_json(request, request.app[SETTINGS].maxRequestBytes)
    task = await request.app[SUPERVISOR].create(parse_model(CreateRequest, data, "body"))
    return json_response(
        {"task": await one_view(request, task)},
        status=201,
        headers={"Location": f"{PREFIX}/tasks/{task.task_id}"},
    )


def _one_task(verb: str) -> Resource:
    """get and pause: a supervisor call on the path's task, answered with the task."""

    @resource(verb)
    async def handler(request: web.Request) -> web.Response:
        supervisor = request.app[SUPERVISOR]
        call = {"get": supervisor.get, "pause": supervisor.pause}
        task = await call[verb](_task_id(request))
        return json_response({"task": await one_view(request, task)})

    return handler


@resource("resume")
async def resume_task(request: web.Request) -> web.Response:
    """Resume; a body's ``milvus_connect_param`` gives the target's new credentials."""
    credentials = None
    if request.can_read_body:
        data = await read_json(request, request.app[SETTINGS].maxRequestBytes)
        credentials = parse_model(ResumeBody, data, "body").milvus_connect_param
    task = await request.app[SUPERVISOR].resume(_task_id(request), credentials)
    return json_response({"task": await one_view(request, task)})


@resource("delete")
async def delete_task(request: web.Request) -> web.Response:
    await request.app[SUPERVISOR].delete(_task_id(request))
    return web.Response(status=204)


@resource("position")
async def task_positions(request: web.Request) -> web.Response:
    task_id = _task_id(request)
    positions = await request.app[SUPERVISOR].positions(task_id)
    return json_response({"task_id": task_id, "positions": positions_view(positions.values())})


@resource("get")
async def task_history(request: web.Request) -> web.Response:
    task_id = _task_id(request)
    await request.app[SUPERVISOR].get(task_id)  # 404 for a task that is not stored
    jobs = request.app.get(JOBS)
    return json_response(
        {
            "task_id": task_id,
            "interval_seconds": jobs.sampler.interval if jobs is not None else None,
            "window_seconds": HISTORY_SECONDS,
            "samples": jobs.sampler.history(task_id) if jobs is not None else [],
            "states": await asyncio.to_thread(state_history.read, request.app[STORE], task_id),
        }
    )


@resource("list")
async def fleet(request: web.Request) -> web.Response:
    return json_response(request.app[SUPERVISOR].fleet_view())


async def _job_body(request: web.Request, example: str) -> dict[str, Any]:
    """The body of a job request (none: every collection the task selects) with the path's
    task id."""
    data = (
        await read_json(request, request.app[SETTINGS].maxRequestBytes)
        if request.body_exists
        else {}
    )
    if not isinstance(data, dict):
        raise BadRequestError(f"body: must be a JSON object like {example}")
    return {**data, "task_id": _task_id(request)}


@resource("backfill")
async def backfill_task(request: web.Request) -> web.Response:
    body = await _job_body(request, '{"collections": ["*"]}')
    task, job_id = await request.app[SUPERVISOR].backfill(
        parse_model(BackfillRequest, body, "body")
    )
    return json_response({"task": await one_view(request, task), "job_id": job_id}, status=202)


@resource("verify")
async def verify_task(request: web.Request) -> web.Response:
    body = await _job_body(request, '{"collections": ["*"], "repair": false}')
    task, job_id = await request.app[SUPERVISOR].verify(parse_model(VerifyRequest, body, "body"))
    return json_response({"task": await one_view(request, task), "job_id": job_id}, status=202)


async def _disaster_answer(
    request: web.Request,
    example: str,
    ask: Callable[[DisasterRecovery, dict[str, Any]], Awaitable[dict[str, Any]]],
    status: int,
) -> web.Response:
    """A disaster-recovery request: its answer beside the task's view."""
    body = await _job_body(request, example)
    answer = await ask(request.app[DISASTER], body)
    task = await request.app[SUPERVISOR].get(answer["task_id"])
    return json_response({"task": await one_view(request, task), **answer}, status=status)


@resource("switchover")
async def switchover_task(request: web.Request) -> web.Response:
    return await _disaster_answer(
        request,
        '{"max_lag_seconds": 30, "timeout_seconds": 600}',
        lambda dr, body: dr.switchover(parse_model(SwitchoverRequest, body, "body")),
        202,
    )


@resource("failover")
async def failover_task(request: web.Request) -> web.Response:
    return await _disaster_answer(
        request,
        '{"export_seconds": 60}',
        lambda dr, body: dr.failover(parse_model(FailoverRequest, body, "body")),
        200,
    )


@resource("failback")
async def failback_task(request: web.Request) -> web.Response:
    return await _disaster_answer(
        request,
        "{}",
        lambda dr, body: dr.failback(parse_model(FailbackRequest, body, "body")),
        202,
    )


ROUTES: list[tuple[str, str, Resource]] = [
    ("GET", "/tasks", list_tasks),
    ("POST", "/tasks", create_task),
    ("GET", "/tasks/{task_id}", _one_task("get")),
    ("DELETE", "/tasks/{task_id}", delete_task),
    ("POST", "/tasks/{task_id}/pause", _one_task("pause")),
    ("POST", "/tasks/{task_id}/resume", resume_task),
    ("GET", "/tasks/{task_id}/positions", task_positions),
    ("GET", "/tasks/{task_id}/history", task_history),
    ("POST", "/tasks/{task_id}/backfill", backfill_task),
    ("POST", "/tasks/{task_id}/verify", verify_task),
    ("POST", "/tasks/{task_id}/switchover", switchover_task),
    ("POST", "/tasks/{task_id}/failover", failover_task),
    ("POST", "/tasks/{task_id}/failback", failback_task),
    ("GET", "/fleet", fleet),
]


def add_rest_routes(app: web.Application) -> None:
    for method, path, handler in ROUTES:
        app.router.add_route(method, PREFIX + path, handler)
