"""The task lifecycle: requests, the task spec, the supervisor and its collaborators.

- :mod:`requests`: the bodies of ``POST /cdc`` and /v1 requests (the Go tool's field names).
- :mod:`spec`: a create request checked against the settings into the stored task spec, and
  the spec's views (public view, target key and label, secrets for the log redactor).
- :mod:`supervisor`: :class:`TaskSupervisor`, the lifecycle (create, pause, resume, delete,
  backfill, verify) composed of :mod:`local_runs` (the runners here and the state writes),
  :mod:`creation` (the create path), :mod:`fleet_rounds` (heartbeats and lease rounds, planned
  by :mod:`fleet`), :mod:`verbs` (pause, resume, delete and their checks) and :mod:`verify`
  (verify jobs).
- :mod:`engine`: the runner factory and a named cluster's context, built from the settings.
- :mod:`reachability`, :mod:`target_check`: whether a source or a target answers.
- :mod:`state_history`: the state and owner changes kept per task.

Nothing here imports ``server.dr``, ``server.http``, ``server.cli`` or ``server.runtime``:
they drive the lifecycle (tests/unit/test_layers.py keeps it so).
"""

from server.tasks.creation import CREATING, TargetChecker
from server.tasks.requests import (
    BackfillRequest,
    CreateRequest,
    TaskIdRequest,
    VerifyRequest,
    parse_model,
)
from server.tasks.spec import validate_create
from server.tasks.supervisor import TaskSupervisor, task_view
from server.tasks.verbs import PAUSED_BY_USER

__all__ = [
    "CREATING",
    "PAUSED_BY_USER",
    "BackfillRequest",
    "CreateRequest",
    "TargetChecker",
    "TaskIdRequest",
    "TaskSupervisor",
    "VerifyRequest",
    "parse_model",
    "task_view",
    "validate_create",
]
