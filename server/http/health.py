"""Health and metrics: ``/livez``, ``/readyz`` (the metastore answers, the key ring is whole)
and ``/metrics`` (Prometheus; behind a token when ``auth.protectMetrics``)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metastore import MetaStoreError
from metastore.format import STORE_FORMAT
from replicator.config.release import RELEASE
from server.app_state import (
    AUTH,
    LIFECYCLE,
    METRICS,
    STORE,
    SUPERVISOR,
)
from server.errors import (
    UnauthorizedError,
)
from server.http.auth import challenge
from server.runtime.jobs import JOBS


async def livez(request: web.Request) -> web.Response:
    """The process answers; with the release it runs and the store format it writes."""
    return web.json_response({"status": "ok", "release": RELEASE, "store_format": STORE_FORMAT})


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
    problem = supervisor.format_problem if supervisor is not None else ""
    if problem:  # another member raised the store's format past what this release reads
        body = {"status": "not ready", "reason": f"metastore format: {problem}", **watch}
        return web.json_response(body, status=503)
    # tasks this release cannot read (a newer release's): left to a member that can
    left_alone = supervisor.left_alone() if supervisor is not None else {}
    alone = {"tasks_left_alone": left_alone} if left_alone else {}
    # client certificates expired or expiring soon: warnings (the daemon still serves; the
    # tasks whose endpoints refuse them say so in their reasons)
    notices = jobs.certificates.notices() if jobs is not None else []
    certificates = {"certificates": notices} if notices else {}
    return web.json_response({"status": "ok", **watch, **alone, **certificates})


async def metrics_endpoint(request: web.Request) -> web.Response:
    auth = request.app[AUTH]
    if auth.protect_metrics:
        try:
            auth.caller(request)
        except UnauthorizedError as exc:
            return web.Response(text=exc.message + "\n", status=401, headers=challenge(exc))
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
