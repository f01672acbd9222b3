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

from metastore import TaskRecord
from replicator.config.settings import CdcSettings, ConfigError
from replicator.config.task_spec import MILVUS_PARAM, TaskSpec
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.targets import open_target
from server.errors import BadRequestError
from server.tasks.spec import cluster_connect
from server.tasks.target_check import explain_target_refusal

log = logging.getLogger(__name__)


def as_configured(spec: TaskSpec, settings: CdcSettings) -> TaskSpec:
    """``spec`` with its ``target_cluster``'s Milvus as the configuration says now (as it was
    read last); ``spec`` itself for any other target, or a cluster no longer configured (its
    stored copy)."""
    name = spec.target_cluster
    if not name or spec.is_kafka or name not in settings.clusters:
        return spec
    param = cluster_connect(settings.cluster(name).milvus, name)
    return TaskSpec.from_stored({**spec.to_stored(), MILVUS_PARAM: param})


class ClusterTargets:
    """Opens the targets of a daemon's runners; a named cluster's as configured now."""

    def __init__(self, settings: CdcSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()  # one reading again of the file at a time

    def open(self, task: TaskRecord) -> MilvusTarget:
        """The target of ``task`` (a runner's ``target_factory``; blocking: the runner's
        thread): a named cluster's as the configuration says now, read again from the file
        when the target refuses the credentials in use."""
        spec = TaskSpec.of(task)
        if spec.target_cluster and not spec.is_kafka:
            self.read_again_if_refused(spec.target_cluster)
            task = replace(task, spec=as_configured(spec, self._settings).to_stored())
        return open_target(task)

    def read_again_if_refused(self, name: str) -> None:
        """When cluster ``name``'s Milvus refuses the block in use, take it as the
        configuration file says now (the daemon's settings change: disaster recovery and the
        reachability probe use it too)."""
        if name not in self._settings.clusters:
            log.warning("target cluster %s is not in the configuration: its stored copy used", name)
            return
        with self._lock:
            cluster = self._settings.cluster(name)
            source = cluster.milvus.source
            if source is None or not explain_target_refusal(cluster_connect(cluster.milvus, name)):
                return
            try:
                again = source()
                cluster_connect(again, name)  # a valid target
            except (ConfigError, KeyError, ValueError, BadRequestError) as exc:
                # the configuration as it is now cannot be used: the block in use stays
                log.warning("clusters.%s.milvus not read again: %s", name, _first_line(exc))
                return
            again.read_again_from(source)
            cluster.milvus = again
        log.info(
            "clusters.%s.milvus read again from the configuration: the target refused the "
            "credentials in use",
            name,
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc.args[0]) if exc.args else type(exc).__name__).splitlines()[0][:300]


__all__ = ["ClusterTargets", "as_configured"]
