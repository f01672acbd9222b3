"""The application's state, reached through typed ``web.AppKey``s (no module-level singletons).

In a module of its own so that the route modules (``app``, ``rest``, ``dashboard``) and the
scheduled jobs can all reach it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from metastore import MetaStore
from server.auth import Authenticator
from server.metrics import DaemonMetrics
from server.settings import CdcSettings
from server.supervisor import TaskSupervisor


@dataclass
class Lifecycle:
    draining: bool = False


SETTINGS = web.AppKey("settings", CdcSettings)
STORE = web.AppKey("store", MetaStore)
SUPERVISOR = web.AppKey("supervisor", TaskSupervisor)
METRICS = web.AppKey("metrics", DaemonMetrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
AUTH = web.AppKey("auth", Authenticator)
