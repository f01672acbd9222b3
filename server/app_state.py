"""The application's state, reached through typed ``web.AppKey``s (no module-level singletons).

In a module of its own so that the route modules (``app``, ``rest``, ``dashboard``) and the
scheduled jobs can all reach it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from metastore import MetaStore
from replicator.config.settings import CdcSettings
from server.dr.manager import DisasterRecovery
from server.http.auth import Authenticator
from server.runtime.metrics import DaemonMetrics
from server.runtime.store_format import StoreFormatKeeper
from server.tasks.supervisor import TaskSupervisor


@dataclass
class Lifecycle:
    draining: bool = False


SETTINGS = web.AppKey("settings", CdcSettings)
STORE = web.AppKey("store", MetaStore)
STORE_FORMAT = web.AppKey("store_format", StoreFormatKeeper)
SUPERVISOR = web.AppKey("supervisor", TaskSupervisor)
DISASTER = web.AppKey("disaster", DisasterRecovery)
METRICS = web.AppKey("metrics", DaemonMetrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
AUTH = web.AppKey("auth", Authenticator)
