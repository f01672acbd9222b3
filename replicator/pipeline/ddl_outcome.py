"""What applying one 2.6 DDL operation did, and the helpers every applier of them uses."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from replicator.errors import Rejection, TargetRejectedError

Status = Literal["applied", "unchanged", "skipped", "not_selected", "disabled"]

# a call refused for one of these reasons left the target as the operation wanted it
EXISTS = frozenset({Rejection.ALREADY_EXISTS})
ABSENT = frozenset({Rejection.NOT_FOUND})


@dataclass(frozen=True)
class Outcome:
    """What :meth:`StreamDdlApplier.apply` did: ``applied``, ``unchanged`` (the target was
    already in that state), ``skipped`` (the target cannot do it; a warning was logged),
    ``not_selected`` (the task does not replicate it) or ``disabled`` (RBAC not asked for)."""

    status: Status
    detail: str = ""


def attempt(what: str, call: Callable[[], None], *, done_if: Collection[Rejection] = ()) -> Outcome:
    """Run one target call: not offered by the target -> skipped; refused for a reason in
    ``done_if`` (it exists already, it is absent already) -> unchanged."""
    try:
        call()
    except TargetRejectedError as exc:
        if unsupported(exc):
            return Outcome("skipped", f"{what}: the target does not offer this call")
        if exc.rejection in done_if:
            return Outcome("unchanged", what)
        raise
    return Outcome("applied", what)


def unsupported(exc: TargetRejectedError) -> bool:
    """The target has no such call (gRPC UNIMPLEMENTED, Milvus 2.3's AlterIndex failing on its
    own empty answer, a target that cannot delete properties)."""
    return exc.rejection is Rejection.UNIMPLEMENTED


def combine(outcomes: list[Outcome], what: str) -> Outcome:
    statuses = {o.status for o in outcomes}
    details = "; ".join(o.detail for o in outcomes if o.detail)
    for status in ("skipped", "applied", "unchanged", "not_selected"):
        if status in statuses:
            return Outcome(status, f"{what}: {details}" if details else what)
    return Outcome("unchanged", what)
