"""The HTTP application: ``POST /cdc`` (the Go milvus-cdc protocol), the /v1 REST resources
(server/http/rest.py), the dashboard at ``/``, ``/openapi.json``, health and metrics; the scheduled
jobs (server/runtime/jobs.py) run while it runs. Who may call what is server/http/auth.py's
business: the task routes ask for a token, health, this document and the dashboard's static
files do not."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metastore import MetaStoreError
from metastore.sealed import SealedMetaStore
from replicator import RunnerFactory
from replicator.config.secret_keys import open_task_store, seal_stored_secrets
from replicator.config.settings import CdcSettings, unused_settings
from replicator.config.stores import describe_metastore
from server.app_state import (
    AUTH,
    DISASTER,
    LIFECYCLE,
    METRICS,
    SETTINGS,
    STORE,
    SUPERVISOR,
    Lifecycle,
)
from server.dr.manager import (
    DisasterRecovery,
    FailbackRequest,
    FailoverRequest,
    SwitchoverRequest,
)
from server.errors import (
    BadRequestError,
    MethodNotAllowedError,
    UnauthorizedError,
    UnavailableError,
)
from server.http import dashboard, rest
from server.http.auth import Authenticator, Principal, audit, challenge, permit
from server.http.common import failure_answer, positions_view, read_json
from server.http.openapi import openapi_endpoint
from server.logs import SecretRedactor
from server.runtime.heap import HeapKeeper
from server.runtime.jobs import JOBS, install_jobs
from server.runtime.metrics import DaemonMetrics
from server.tasks.creation import TargetChecker
from server.tasks.engine import make_runner_factory
from server.tasks.requests import (
    BackfillRequest,
    CreateRequest,
    DeleteRequest,
    ListRequest,
    TaskIdRequest,
    VerifyRequest,
    parse_model,
)
from server.tasks.supervisor import TaskSupervisor, task_view
from server.tasks.target_check import check_target_reachable

log = logging.getLogger(__name__)

__all__ = ["LIFECYCLE", "METRICS", "SETTINGS", "STORE", "SUPERVISOR", "Lifecycle", "create_app"]

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
    await sup.resume(parse_model(TaskIdRequest, data).task_id)
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


async def livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[LIFECYCLE].draining:
        return web.json_response({"status": "draining"}, status=503)
    jobs = request.app.get(JOBS)
    # the scheduled health check's last result, next to this request's own ping
    watch = {"metastore_watch": jobs.health.view()} if jobs is not None else {}
    try:
        await asyncio.wait_for(asyncio.to_thread(request.app[STORE].ping), timeout=3)
    except (MetaStoreError, TimeoutError) as exc:
        return web.json_response(
            {"status": "unavailable", "reason": f"metastore: {exc or 'timeout'}", **watch},
            status=503,
        )
    supervisor = request.app.get(SUPERVISOR)
    missing = supervisor.missing_keys if supervisor is not None else None
    if missing is not None:  # key ids only, never a key
        body = {"status": "not ready", "reason": f"secrets: {missing}", **watch}
        return web.json_response({**body, "missing_keys": list(missing.missing)}, status=503)
    return web.json_response({"status": "ok", **watch})


async def metrics_endpoint(request: web.Request) -> web.Response:
    auth = request.app[AUTH]
    if auth.protect_metrics:
        try:
            auth.caller(request)
        except UnauthorizedError as exc:
            return web.Response(text=exc.message + "\n", status=401, headers=challenge(exc))
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
        if request.path.startswith(rest.PREFIX + "/"):
            return rest.problem(exc.status, f"{exc.reason}: {request.method} {request.path}")
        if exc.status == 404:
            return envelope(404, f"no such path: {request.path}")
        return envelope(exc.status, exc.reason)


def create_app(
    settings: CdcSettings,
    *,
    runner_factory: RunnerFactory | None = None,
    target_checker: TargetChecker = check_target_reachable,
    redactor: SecretRedactor | None = None,
    heap: HeapKeeper | None = None,
) -> web.Application:
    app = web.Application(client_max_size=settings.maxRequestBytes, middlewares=[json_errors])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()
    app[AUTH] = Authenticator(settings.auth)

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        log.info("opening metastore: %s", describe_metastore(settings.metaStoreConfig))
        for unused in unused_settings(settings):
            log.warning("set but not used by this daemon: %s", unused)
        store = await asyncio.to_thread(open_task_store, settings, create_key=True)
        app[STORE] = store
        await asyncio.to_thread(seal_stored_secrets, store)
        yield
        await asyncio.to_thread(store.close)

    async def supervisor_ctx(app: web.Application) -> AsyncIterator[None]:
        factory = runner_factory or make_runner_factory(settings)
        store = app[STORE]
        supervisor = TaskSupervisor(
            store,
            settings,
            factory,
            target_checker,
            redactor,
            key_check=store.missing_keys if isinstance(store, SealedMetaStore) else None,
        )
        app[SUPERVISOR] = supervisor
        disaster = DisasterRecovery(supervisor, settings)
        supervisor.add_progress_source(disaster)
        app[DISASTER] = disaster
        app[METRICS] = DaemonMetrics(
            supervisor.state_counts,
            supervisor.all_progress,
            supervisor.task_states,
            supervisor.fleet_view,
            heap.stats if heap is not None else None,
            supervisor.timings,
        )
        await supervisor.start()
        await disaster.recover()
        yield
        disaster.stop()
        app[LIFECYCLE].draining = True
        await supervisor.drain(settings.drainTimeoutSeconds)

    app.cleanup_ctx.extend([store_ctx, supervisor_ctx])
    install_jobs(app, settings.scheduler, settings.verify, settings.source_of)
    app.router.add_route("*", "/cdc", cdc_endpoint)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/openapi.json", openapi_endpoint)
    rest.add_rest_routes(app)
    dashboard.add_dashboard_routes(app)
    return app
