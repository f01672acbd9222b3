"""The process of one channel group of a task (:mod:`replicator.pipeline.group_runner`):
started with ``spawn`` (a fresh interpreter: nothing of the daemon's threads is copied), it
builds its source cluster's context from the daemon's settings, as the daemon does, and runs
the group's channels (:mod:`replicator.pipeline.group_child`)."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.process import BaseProcess

from replicator.config.redaction import secret_values
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.pipeline.group_child import run_group
from replicator.pipeline.group_link import Link
from replicator.pipeline.group_runner import GroupStart
from replicator.pipeline.runner_context import RunnerContext
from replicator.sinks.kafka_groups import GroupKafkaTarget
from replicator.sinks.targets import incarnation
from server.interpreter import tune_gc, tune_interpreter
from server.logs import configure_logging

# the context of a named source cluster, built from the settings (engine.cluster_context)
BuildContext = Callable[[CdcSettings, str], RunnerContext]


def start_group(settings_json: str, build: BuildContext, start: GroupStart) -> BaseProcess:
    """Start a group's process (a daemon process of this one: it ends with it), given the
    daemon's settings as JSON, secrets revealed."""
    spawn = multiprocessing.get_context("spawn")
    process = spawn.Process(
        target=group_main,
        args=(settings_json, build, start),
        name=f"milvus-cdc-{start.task.task_id[:8]}-{start.name}",
        daemon=True,
    )
    process.start()
    return process


def group_main(settings_json: str, build: BuildContext, start: GroupStart) -> None:
    settings = CdcSettings(**json.loads(settings_json))
    # as the daemon's (the same pipeline runs here): its lock turn, and the modules the spawn
    # imported out of the collector's reach, its young generation collected less often
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
