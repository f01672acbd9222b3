"""The HTTP application: ``POST /cdc`` (the Go milvus-cdc protocol), health and metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metastore import MetaStore, MetaStoreError, MetaStoreUnavailableError
from replicator import RunnerFactory
from server.api_models import (
    CreateRequest,
    DeleteRequest,
    ListRequest,
    TaskIdRequest,
    parse_model,
)
from server.engine import make_runner_factory
from server.errors import (
    ApiError,
    BadRequestError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    UnavailableError,
)
from server.logs import SecretRedactor
from server.metrics import DaemonMetrics
from server.settings import CdcSettings
from server.stores import describe_metastore, open_metastore
from server.supervisor import TargetChecker, TaskSupervisor, task_view
from server.target_check import check_target_reachable

log = logging.getLogger(__name__)


@dataclass
class Lifecycle:
    draining: bool = False


SETTINGS = web.AppKey("settings", CdcSettings)
STORE = web.AppKey("store", MetaStore)
SUPERVISOR = web.AppKey("supervisor", TaskSupervisor)
METRICS = web.AppKey("metrics", DaemonMetrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)

Handler = Callable[[TaskSupervisor, Any], Awaitable[dict[str, Any]]]


# --- request handlers: request_data in, response data out ------------------------------------
async def _create(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    task = await sup.create(parse_model(CreateRequest, data))
    return {"task_id": task.task_id}


async def _delete(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    req = parse_model(DeleteRequest, data)
    await sup.delete(req.task_id, ignore_not_found=req.ignore_not_found)
    return {}


async def _pause(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    await sup.pause(parse_model(TaskIdRequest, data).task_id)
    return {}


async def _resume(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    await sup.resume(parse_model(TaskIdRequest, data).task_id)
    return {}


async def _get(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    task = await sup.get(parse_model(TaskIdRequest, data).task_id)
    view = task_view(task, sup.progress(task.task_id))
    # The Go server answers "task"; its document shows "Task". Serve both spellings.
    return {"task": view, "Task": view}


async def _list(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    parse_model(ListRequest, data)
    progress = sup.all_progress()
    return {"tasks": [task_view(t, progress.get(t.task_id)) for t in await sup.list()]}


async def _position(sup: TaskSupervisor, data: Any) -> dict[str, Any]:
    positions = await sup.positions(parse_model(TaskIdRequest, data).task_id)
    return {
        "positions": [
            {
                "channel_name": p.pchannel,
                "backend": p.backend,
                "msg_id": base64.b64encode(p.msg_id).decode(),
                "tt": p.ts,
                "time": p.ts >> 18,  # physical milliseconds of the hybrid timestamp
            }
            for p in sorted(positions.values(), key=lambda p: p.pchannel)
        ]
    }


HANDLERS: dict[str, Handler] = {
    "create": _create,
    "delete": _delete,
    "pause": _pause,
    "resume": _resume,
    "get": _get,
    "list": _list,
    "position": _position,
}


def envelope(code: int, message: str = "", data: dict[str, Any] | None = None) -> web.Response:
    body = orjson.dumps({"code": code, "message": message, "data": data or {}})
    return web.Response(body=body, status=code, content_type="application/json")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _read_request(request: web.Request) -> tuple[str, Any]:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLargeError(
            f"request body is larger than the limit of {request.app[SETTINGS].maxRequestBytes} "
            "bytes (maxRequestBytes)"
        ) from exc
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
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
    try:
        if request.method != "POST":
            raise MethodNotAllowedError(f"method {request.method} is not allowed; use POST /cdc")
        if request.app[LIFECYCLE].draining:
            raise UnavailableError("the daemon is shutting down")
        request_type, data = await _read_request(request)
        result = await HANDLERS[request_type](request.app[SUPERVISOR], data)
        status = 200
        return envelope(200, "", result)
    except ApiError as exc:
        status = exc.status
        return envelope(exc.status, exc.message)
    except MetaStoreUnavailableError as exc:
        status = 503
        log.warning("metastore unavailable during %s: %s", request_type, exc)
        return envelope(503, f"metastore unavailable, try again: {exc}")
    except MetaStoreError as exc:
        status = 500
        log.error("metastore error during %s: %s", request_type, exc)
        return envelope(500, f"metastore error: {exc}")
    except Exception:
        status = 500
        log.exception("internal error while handling %s", request_type)
        return envelope(500, f"internal error while handling {request_type}; see the daemon log")
    finally:
        request.app[METRICS].observe_request(request_type, status, time.perf_counter() - started)


async def livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[LIFECYCLE].draining:
        return web.json_response({"status": "draining"}, status=503)
    try:
        await asyncio.wait_for(asyncio.to_thread(request.app[STORE].ping), timeout=3)
    except (MetaStoreError, TimeoutError) as exc:
        return web.json_response(
            {"status": "unavailable", "reason": f"metastore: {exc or 'timeout'}"}, status=503
        )
    return web.json_response({"status": "ok"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


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
        if exc.status == 404:
            return envelope(404, f"no such path: {request.path}")
        return envelope(exc.status, exc.reason)


def create_app(
    settings: CdcSettings,
    *,
    runner_factory: RunnerFactory | None = None,
    target_checker: TargetChecker = check_target_reachable,
    redactor: SecretRedactor | None = None,
) -> web.Application:
    app = web.Application(client_max_size=settings.maxRequestBytes, middlewares=[json_errors])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        log.info("opening metastore: %s", describe_metastore(settings.metaStoreConfig))
        store = await asyncio.to_thread(open_metastore, settings.metaStoreConfig)
        app[STORE] = store
        yield
        await asyncio.to_thread(store.close)

    async def supervisor_ctx(app: web.Application) -> AsyncIterator[None]:
        factory = runner_factory or make_runner_factory(settings)
        supervisor = TaskSupervisor(app[STORE], settings, factory, target_checker, redactor)
        app[SUPERVISOR] = supervisor
        app[METRICS] = DaemonMetrics(supervisor.state_counts, supervisor.all_progress)
        await supervisor.start()
        yield
        app[LIFECYCLE].draining = True
        await supervisor.drain(settings.drainTimeoutSeconds)

    app.cleanup_ctx.extend([store_ctx, supervisor_ctx])
    app.router.add_route("*", "/cdc", cdc_endpoint)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    return app
