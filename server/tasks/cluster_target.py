"""The target of a task naming ``target_cluster``: the Milvus of ``clusters.<name>.milvus`` as
the daemon's configuration says now, not the copy the task stored at create.

Each time a runner connects (its start, which ``resume`` does, and every reconnect) the
endpoint and credentials come from the configuration. When the target refuses them (its
password was changed, its CA rotated), the block is read again from the configuration file
(server/cli/serve.py ``read_passwords_again``): an operator who changed the password on the
Milvus and in the file resumes the task, with no body, and it goes on from its positions.
The copy in the stored spec stays (an earlier release reads it; a cluster no longer in the
configuration falls back to it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from metastore import TaskRecord
from replicator.config.milvus_endpoint import SourceMilvusSettings
from replicator.config.settings import CdcSettings, ConfigError
from replicator.config.task_spec import MILVUS_PARAM, TaskSpec
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.targets import open_target
from server.errors import BadRequestError
from server.tasks.spec import cluster_connect
from server.tasks.target_check import explain_target_refusal

log = logging.getLogger(__name__)


class ClusterTargets:
    """The named clusters' Milvus blocks in use by the runners of this daemon."""

    def __init__(self, settings: CdcSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._current: dict[str, SourceMilvusSettings] = {}  # read again since start

    def open(self, task: TaskRecord) -> MilvusTarget:
        """The target of ``task`` (a runner's ``target_factory``; blocking: the runner's
        thread): a named cluster's as the configuration says now."""
        spec = TaskSpec.of(task)
        if spec.target_cluster and not spec.is_kafka:
            param = self.connect_param(spec.target_cluster)
            if param is not None:
                task = replace(task, spec={**task.spec, MILVUS_PARAM: param})
        return open_target(task)

    def connect_param(self, name: str) -> dict[str, Any] | None:
        """The ``milvus_connect_param`` of cluster ``name``'s Milvus now; read again from the
        configuration file when the target refuses the one in use. None: the cluster is no
        longer configured (the task's stored copy is used)."""
        try:
            configured = self._settings.cluster(name).milvus
        except KeyError:
            log.warning("target cluster %s is not in the configuration: its stored copy used", name)
            return None
        with self._lock:
            milvus = self._current.get(name, configured)
        param = cluster_connect(milvus, name)
        if configured.source is None or not explain_target_refusal(param):
            return param
        try:
            again = configured.source()
            fresh = cluster_connect(again, name)
        except (ConfigError, KeyError, ValueError, BadRequestError) as exc:
            # the configuration as it is now cannot be used: the one in use stays
            log.warning("clusters.%s.milvus not read again: %s", name, _first_line(exc))
            return param
        with self._lock:
            self._current[name] = again
        if fresh != param:
            log.info(
                "clusters.%s.milvus read again from the configuration: the target refused "
                "the credentials in use",
                name,
            )
        return fresh


def _first_line(exc: BaseException) -> str:
    return (str(exc.args[0]) if exc.args else type(exc).__name__).splitlines()[0][:300]


__all__ = ["ClusterTargets"]
