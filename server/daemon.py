"""Run the daemon until SIGTERM/SIGINT, then drain within ``drainTimeoutSeconds``.

A first signal stops accepting requests (``/readyz`` answers 503), stops every task runner so
it saves its positions, and closes the metastore. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl

from aiohttp import web

from replicator.config.security import TlsSettings
from replicator.config.settings import CdcSettings
from server.app import create_app
from server.app_state import LIFECYCLE
from server.http.auth import listen_host
from server.http.starting import starting_app
from server.interpreter import tune_gc, tune_interpreter
from server.listen import bind
from server.logs import SecretRedactor
from server.runtime.heap import HeapKeeper
from server.tasks.group_process import warm_group_processes

log = logging.getLogger(__name__)


def server_tls_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """The HTTPS context of ``tls.certFile``/``tls.keyFile`` (TLS 1.2 or later); None: HTTP."""
    if not tls.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certFile, tls.keyFile)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise SystemExit(
            f"tls.certFile {tls.certFile} / tls.keyFile {tls.keyFile}: cannot load the "
            f"certificate and key: {reason}"
        ) from exc
    return context


async def serve(settings: CdcSettings, redactor: SecretRedactor | None = None) -> None:
    tune_interpreter(settings)
    heap = HeapKeeper(settings.memory)
    heap.start()  # before the task threads: the arena limit applies to threads made after it
    app = create_app(settings, redactor=redactor, heap=heap)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    ssl_context = server_tls_context(settings.tls)  # before anything opens: a bad file stops it
    configured_host, port = settings.host_port
    host = listen_host(configured_host, settings.auth)
    sockets = bind(host, port)  # before anything opens: the port is this daemon's from now
    scheme = "https" if ssl_context else "http"
    log.info("milvus-cdc listening on %s://%s:%d (starting: 503 until ready)", scheme, host, port)
    early = web.AppRunner(starting_app(), handle_signals=False, access_log=None)
    started = False
    try:
        await early.setup()
        for sock in sockets:  # a copy each: the early server closes its own when it stops
            site = web.SockSite(early, sock.dup(), ssl_context=ssl_context, shutdown_timeout=5)
            await site.start()
        if settings.kafkaTargetProcesses > 1:
            warm_group_processes()  # the groups of the tasks brought back start without imports
        await runner.setup()  # opens the metastore, brings the tasks back, the recover round
        started = True
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    except BaseException:
        if started:
            await runner.cleanup()
        await early.cleanup()
        for sock in sockets:
            sock.close()
        raise
    await early.cleanup()  # its requests under way answered; the daemon's own serve from here
    log.info("milvus-cdc ready on %s://%s:%d", scheme, host, port)
    tune_gc()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info("%s received: draining", signal.Signals(signum).name)
        app[LIFECYCLE].draining = True
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await stop.wait()
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=settings.drainTimeoutSeconds + 5)
    except TimeoutError:
        log.error("drain did not finish within %.0f s", settings.drainTimeoutSeconds + 5)
    heap.stop()
    log.info("milvus-cdc stopped")
