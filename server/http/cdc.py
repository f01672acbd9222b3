"""``POST /cdc``: the Go milvus-cdc's protocol (``request_type`` and ``request_data`` in, the
``{code, message, data}`` envelope out), one handler per request type; aiohttp's own errors
answer in the same envelope."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from server.app_state import (
    AUTH,
    DISASTER,
    LIFECYCLE,
    METRICS,
    SETTINGS,
    SUPERVISOR,
)
from server.dr.failbacks import FailbackRequest
from server.dr.failover import FailoverRequest
from server.dr.manager import SwitchoverRequest
from server.errors import (
    BadRequestError,
    MethodNotAllowedError,
    UnavailableError,
)
from server.http import rest
from server.http.auth import Principal, audit, challenge, permit
from server.http.common import failure_answer, positions_view, read_json
from server.tasks.requests import (
    BackfillRequest,
    CreateRequest,
    DeleteRequest,
    ListRequest,
    ResumeRequest,
    TaskIdRequest,
    VerifyRequest,
    parse_model,
)
from server.tasks.supervisor import task_view

log = logging.getLogger(__name__)

Handler = Callable[[web.Application, Any], Awaitable[dict[str, Any]]]


# --- request handlers: request_data in, response data out ------------------------------------
async def _create(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    task = await sup.create(parse_model(CreateRequest, data))
    return {"task_id": task.task_id}


async def _delete(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    req = parse_model(DeleteRequest, data)
    await sup.delete(req.task_id, ignore_not_found=req.ignore_not_found)
    return {}


async def _pause(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    await sup.pause(parse_model(TaskIdRequest, data).task_id)
    return {}


async def _resume(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    request = parse_model(ResumeRequest, data)
    await sup.resume(request.task_id, request.milvus_connect_param)
    return {}


async def _get(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    task = await sup.get(parse_model(TaskIdRequest, data).task_id)
    view = task_view(task, sup.progress(task.task_id), (await sup.owners()).get(task.task_id))
    # The Go server answers "task"; its document shows "Task". Serve both spellings.
    return {"task": view, "Task": view}


async def _list(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    parse_model(ListRequest, data)
    tasks = await sup.list()
    progress = sup.all_progress(fleet=True)
    owners = await sup.owners()
    return {"tasks": [task_view(t, progress.get(t.task_id), owners.get(t.task_id)) for t in tasks]}


async def _backfill(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    task, job_id = await sup.backfill(parse_model(BackfillRequest, data))
    return {"task_id": task.task_id, "job_id": job_id}


async def _verify(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    task, job_id = await sup.verify(parse_model(VerifyRequest, data))
    return {"task_id": task.task_id, "job_id": job_id}


async def _switchover(app: web.Application, data: Any) -> dict[str, Any]:
    return await app[DISASTER].switchover(parse_model(SwitchoverRequest, data))


async def _failover(app: web.Application, data: Any) -> dict[str, Any]:
    return await app[DISASTER].failover(parse_model(FailoverRequest, data))


async def _failback(app: web.Application, data: Any) -> dict[str, Any]:
    return await app[DISASTER].failback(parse_model(FailbackRequest, data))


async def _position(app: web.Application, data: Any) -> dict[str, Any]:
    sup = app[SUPERVISOR]
    positions = await sup.positions(parse_model(TaskIdRequest, data).task_id)
    return {"positions": positions_view(positions.values())}


HANDLERS: dict[str, Handler] = {
    "create": _create,
    "delete": _delete,
    "pause": _pause,
    "resume": _resume,
    "get": _get,
    "list": _list,
    "position": _position,
    "backfill": _backfill,
    "verify": _verify,
    "switchover": _switchover,
    "failover": _failover,
    "failback": _failback,
}


def envelope(
    code: int,
    message: str = "",
    data: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = orjson.dumps({"code": code, "message": message, "data": data or {}})
    return web.Response(body=body, status=code, content_type="application/json", headers=headers)


async def _read_request(request: web.Request) -> tuple[str, Any]:
    payload = await read_json(request, request.app[SETTINGS].maxRequestBytes)
    if not isinstance(payload, dict):
        raise BadRequestError("request body must be a JSON object with request_type")
    extra = sorted(set(payload) - {"request_type", "request_data"})
    if extra:
        raise BadRequestError(f"unknown field(s) in the request body: {', '.join(extra)}")
    request_type = payload.get("request_type")
    if not isinstance(request_type, str) or not request_type:
        raise BadRequestError("request_type: required, a string")
    if request_type not in HANDLERS:
        raise BadRequestError(
            f"request_type: unknown value {request_type[:64]!r}; use one of {', '.join(HANDLERS)}"
        )
    return request_type, payload.get("request_data")


async def cdc_endpoint(request: web.Request) -> web.Response:
    started = time.perf_counter()
    request_type = "unknown"
    status = 500
    principal: Principal | None = None
    auth = request.app[AUTH]
    try:
        if request.method != "POST":
            raise MethodNotAllowedError(f"method {request.method} is not allowed; use POST /cdc")
        # Who asks first (401 before reading the body); what they may do once it is read (403).
        principal = auth.caller(request)
        if request.app[LIFECYCLE].draining:
            raise UnavailableError("the daemon is shutting down")
        request_type, data = await _read_request(request)
        permit(principal, request_type)
        result = await HANDLERS[request_type](request.app, data)
        status = 200
        return envelope(200, "", result)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
        status, message = failure_answer(exc, request_type)
        return envelope(status, message, headers=challenge(exc))
    finally:
        seconds = time.perf_counter() - started
        request.app[METRICS].observe_request(request_type, status, seconds)
        request.app[METRICS].go.observe_cdc(request_type, status, seconds, request.method)
        audit(request, principal, request_type, status)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own errors (unknown path, ...) answer in the same envelope as ours."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if request.path.startswith(rest.PREFIX + "/"):
            return rest.problem(exc.status, f"{exc.reason}: {request.method} {request.path}")
        if exc.status == 404:
            return envelope(404, f"no such path: {request.path}")
        return envelope(exc.status, exc.reason)
