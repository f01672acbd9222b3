"""The composition root: the application built from its parts, and their lifetimes.

``create_app`` opens the metastore, builds the task supervisor and disaster recovery (which
drives the supervisor through a protocol; the application holds both), the metrics and the
scheduled jobs (server/runtime/jobs.py), and mounts the routes of ``server/http/``: ``POST /cdc``
(cdc.py), the /v1 REST resources (rest.py), health and metrics (health.py), ``/openapi.json``
and the dashboard at ``/``. Who may call what is server/http/auth.py's business."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

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
    STORE_FORMAT,
    SUPERVISOR,
    Lifecycle,
)
from server.dr.flows import injected_fault
from server.dr.manager import (
    DisasterRecovery,
)
from server.http import dashboard, rest
from server.http.auth import Authenticator
from server.http.cdc import cdc_endpoint, json_errors
from server.http.health import livez, metrics_endpoint, readyz
from server.http.openapi import openapi_endpoint
from server.logs import SecretRedactor
from server.runtime.heap import HeapKeeper
from server.runtime.jobs import install_jobs
from server.runtime.metrics import DaemonMetrics
from server.runtime.store_format import StoreFormatKeeper
from server.tasks.certificates import daemon_certificates
from server.tasks.creation import TargetChecker
from server.tasks.engine import make_runner_factory
from server.tasks.fleet import Membership
from server.tasks.supervisor import TaskSupervisor
from server.tasks.target_check import check_target_reachable

log = logging.getLogger(__name__)

__all__ = ["create_app"]


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
        # an earlier release's data brought to this release's format, once (a breaking step
        # only when every live fleet member reads it; the scheduler tries it again until then)
        member_id = Membership(settings.fleet, settings.host_port[1]).member_id
        keeper = StoreFormatKeeper(store, member_id)
        try:
            await asyncio.to_thread(keeper.migrate)
        except BaseException:
            await asyncio.to_thread(store.close)
            raise
        app[STORE] = store
        app[STORE_FORMAT] = keeper
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
        supervisor.add_verb_check(disaster.pairs.check_verb)
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
        await injected_fault("start_recover", job="daemon")  # a hold only (tests): a slow round
        await disaster.recover()
        yield
        disaster.stop()
        app[LIFECYCLE].draining = True
        await supervisor.drain(settings.drainTimeoutSeconds)

    app.cleanup_ctx.extend([store_ctx, supervisor_ctx])
    install_jobs(
        app,
        settings.scheduler,
        settings.verify,
        settings.source_of,
        daemon_certificates(settings),
    )
    app.router.add_route("*", "/cdc", cdc_endpoint)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/openapi.json", openapi_endpoint)
    rest.add_rest_routes(app)
    dashboard.add_dashboard_routes(app)
    return app
