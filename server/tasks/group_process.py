"""The process of one channel group of a task (:mod:`replicator.pipeline.group_runner`):
forked by multiprocessing's fork server (a process of one thread started afresh, never a copy
of the daemon's threads), which imported what a group runs once (:mod:`server.group_preload`); it
builds its source cluster's context from the daemon's settings, as the daemon does, and runs
the group's channels (:mod:`replicator.pipeline.group_child`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess

from replicator.config.redaction import secret_values
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.pipeline.group_child import run_group
from replicator.pipeline.group_link import Link
from replicator.pipeline.group_runner import GROUP_PROCESSES, GroupStart
from replicator.pipeline.runner_context import RunnerContext
from replicator.sinks.kafka_groups import GroupKafkaTarget
from replicator.sinks.targets import incarnation
from server.interpreter import tune_gc, tune_interpreter
from server.logs import configure_logging

# the context of a named source cluster, built from the settings (engine.cluster_context)
BuildContext = Callable[[CdcSettings, str], RunnerContext]
# what the fork server imports before it forks a group, whenever it starts
PRELOAD = ["server.group_preload"]
GROUP_PROCESSES.set_forkserver_preload(PRELOAD)


def warm_group_processes() -> None:
    """Start the fork server now (it imports in the background), not at the first group's
    start: a daemon whose Kafka tasks run in groups (``kafkaTargetProcesses`` > 1) calls it
    at its start. Without it the first group's start starts it."""
    forkserver.ensure_running()


def start_group(settings_json: str, build: BuildContext, start: GroupStart) -> BaseProcess:
    """Start a group's process (a daemon process of this one: it ends with it), given the
    daemon's settings as JSON, secrets revealed."""
    process = GROUP_PROCESSES.Process(
        target=group_main,
        args=(settings_json, build, start),
        name=f"milvus-cdc-{start.task.task_id[:8]}-{start.name}",
        daemon=True,
    )
    process.start()
    return process


def group_main(settings_json: str, build: BuildContext, start: GroupStart) -> None:
    settings = CdcSettings(**json.loads(settings_json))
    # as the daemon's (the same pipeline runs here): its lock turn, and what it made since the
    # fork server's freeze out of the collector's reach, its young generation collected less
    # often
    tune_interpreter(settings)
    tune_gc()
    redactor = configure_logging(settings.logLevel, settings.logFormat)
    redactor.add(*secret_values(settings))
    task = start.task
    spec = TaskSpec.of(task)
    link = Link(start.conn, f"group {start.name} of task {task.task_id}")
    context = build(settings, spec.source_name)
    first = start.index == 0  # the replicate channel, aliases and imports are the first's

    def target(_task: object) -> GroupKafkaTarget:
        return GroupKafkaTarget(
            spec.target_param,
            task.task_id,
            incarnation(task),
            start.name,
            lambda method, request, what: link.call("target", (method, request, what)),
        )

    context = replace(
        context,
        channels=list(start.channels),
        target_factory=target,
        group=start.name,
        replicate_channel=first,
        ddl_lock=start.ddl_lock,
        aliases=context.aliases if first else None,
        imports=context.imports if first else None,
        import_serving=context.import_serving if first else None,
    )
    run_group(task, context, link)
