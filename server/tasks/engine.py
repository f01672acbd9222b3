"""Build task runners from the daemon's settings: the source queue, the source catalog, the
channels to read."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import grpc
from etcd3.exceptions import Etcd3Exception
from pydantic import SecretStr

from metastore import MetaStore, TaskRecord
from replicator import FailureCallback, RunnerFactory, TaskRunner
from replicator.backfill.phase import DriverLauncher
from replicator.codec.streaming import record_kind
from replicator.config.milvus_endpoint import milvus_param
from replicator.config.settings import CdcSettings
from replicator.config.stores import etcd_client_for, explain_etcd
from replicator.config.task_spec import TaskSpec
from replicator.meta.catalog import AliasMeta, CollectionMeta, SourceCatalog
from replicator.meta.imports import SourceImport
from replicator.meta.shared_read import SharedRead
from replicator.pipeline.group_runner import GroupedRunner
from replicator.pipeline.import_serving import LoadedOnSource, ServingCheck
from replicator.pipeline.runner import ReplicationRunner
from replicator.pipeline.runner_context import RunnerContext
from replicator.sinks.kafka_groups import processes_of
from replicator.sources.base import READ_BYTES, SourceUnavailableError, WalSource
from replicator.sources.factory import WalDefaults, open_source
from replicator.sources.shared_source import SharedSource
from server.tasks.cluster_target import ClusterTargets
from server.tasks.group_process import start_group
from server.tasks.spec import backfill_unavailable

T = TypeVar("T")

# how old an answer of the source's aliases or imports a task's poller takes (they poll every
# 2 s; the catalog reads that place collections always read afresh)
POLL_ANSWER_AGE = 1.0


def make_runner_factory(settings: CdcSettings) -> RunnerFactory:
    """Runners of every task: a task reads its ``source_cluster`` (sourceConfig unless it names
    one of ``clusters``), through that cluster's context, made once and shared by its tasks."""
    contexts: dict[str, RunnerContext] = {}
    lock = threading.Lock()
    targets = ClusterTargets(settings)  # a target_cluster's Milvus as configured now
    # a channel group's process rebuilds the settings from these (through its pipe, never a
    # command line or a file: they hold secrets)
    settings_json = json.dumps(_revealed(settings.model_dump()))

    def factory(task: TaskRecord, store: MetaStore, on_failure: FailureCallback) -> TaskRunner:
        name = TaskSpec.of(task).source_name
        with lock:
            if name not in contexts:
                context = cluster_context(settings, name)
                contexts[name] = replace(context, target_factory=targets.open)
            context = contexts[name]
        spec = TaskSpec.of(task)
        processes = (
            processes_of(spec.target_param, settings.kafkaTargetProcesses) if spec.is_kafka else 1
        )
        if processes > 1:
            start = partial(start_group, settings_json, cluster_context)
            return GroupedRunner(task, store, on_failure, context, start, processes)
        return ReplicationRunner(task, store, on_failure, context)

    return factory


def cluster_context(
    settings: CdcSettings, name: str, *, shared_readers: bool | None = None
) -> RunnerContext:
    """What the runners of one source cluster share: its etcd client and catalog reads, its
    shared channel readers, its Milvus (import serving), the backfill launcher.
    ``shared_readers``: overrides the cluster's ``sharedReaders`` (a one-off read: False)."""
    source_config = settings.cluster(name)
    if shared_readers is not None:
        source_config = source_config.model_copy(update={"sharedReaders": shared_readers})
    clients: list[Any] = []  # one source-etcd client for the daemon's life, opened on demand
    lock = threading.Lock()

    def read_catalog(read: Callable[[SourceCatalog], T]) -> T:
        try:
            with lock:
                if not clients:
                    clients.append(etcd_client_for(source_config.etcd))
                client = clients[0]
            return read(SourceCatalog(client, source_config.root_path, source_config.meta_sub_path))
        except (Etcd3Exception, grpc.RpcError, ValueError) as exc:
            reason = explain_etcd(source_config.etcd, exc)
            raise SourceUnavailableError(f"source etcd {reason}") from exc

    # the tasks' whole-catalog reads, one at a time for all of them (a fresh answer each:
    # replicator/meta/shared_read.py); fifty tasks starting together make one etcd read
    catalog: Callable[[], dict[int, CollectionMeta]] = SharedRead(
        lambda: read_catalog(SourceCatalog.collections)
    )
    # the pollers (every task's alias mirror and import watcher, every 2 s) take an answer up to
    # POLL_ANSWER_AGE old: with many tasks, about one etcd read a second each
    aliases: Callable[[], list[AliasMeta]] = SharedRead(
        lambda: read_catalog(SourceCatalog.aliases), max_age=POLL_ANSWER_AGE
    )

    def collection(collection_id: int) -> CollectionMeta | None:
        return read_catalog(lambda catalog: catalog.collection(collection_id))

    imports: Callable[[], list[SourceImport]] = SharedRead(
        lambda: read_catalog(SourceCatalog.imports), max_age=POLL_ANSWER_AGE
    )

    defaults = WalDefaults(
        kafka_address=source_config.kafka.address,
        kafka_extra={
            "fetch.wait.max.ms": source_config.kafka.fetchWaitMs,
            **source_config.kafka.client_security(),
        },
        rocksmq_path=source_config.rocksmq.path,
        pulsar=source_config.pulsar.source_kwargs(),
    )

    shared: list[SharedSource] = []  # the daemon's one shared source, opened on demand

    def source() -> WalSource:
        if not source_config.sharedReaders:
            return open_source(source_config.mq_type, {}, defaults)
        with lock:
            if not shared:
                window = source_config.readChanLen * READ_BYTES
                inner = open_source(source_config.mq_type, {}, defaults)
                shared.append(
                    SharedSource(inner, window, depth=source_config.readChanLen, kind=record_kind)
                )
            return shared[0]

    def open_wal(kind: str, config: Mapping[str, str]) -> WalSource:
        """A WAL the source switched to; settings the message lacks come from the daemon's
        configuration of that kind."""
        return open_source(kind, config, defaults)

    milvus = source_config.milvus
    serving = None
    if milvus.uri:
        # one GetQuerySegmentInfo client per source database for the daemon's life
        loaded = LoadedOnSource(milvus_param(milvus))
        serving = ServingCheck(loaded, lambda c: read_catalog(lambda cat: cat.segments(c)))

    return RunnerContext(
        source=source,
        catalog=catalog,
        channels=source_config.dml_channels,
        default_partition=source_config.defaultPartitionName,
        aliases=aliases,
        collection=collection,
        open_wal=open_wal,
        backfill=backfill_launcher(settings),
        read_ahead=source_config.readChanLen,
        imports=imports,
        backfill_blocker=backfill_unavailable(settings, name),
        import_serving=serving,
    )


def backfill_launcher(settings: CdcSettings) -> DriverLauncher:
    """The driver of a backfill job runs this interpreter with the daemon's settings on its
    stdin (never on its command line or in a file: they hold secrets)."""
    return DriverLauncher(
        python=sys.executable,
        settings_json=json.dumps(_revealed(settings.model_dump())).encode(),
        log_dir=settings.backfill.logDir,
        max_attempts=settings.backfill.maxJobAttempts,
        spark_conf=dict(settings.backfill.sparkConf),
    )


def _revealed(node: Any) -> Any:
    if isinstance(node, SecretStr):
        return node.get_secret_value()
    if isinstance(node, dict):
        return {k: _revealed(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_revealed(v) for v in node]
    return node
