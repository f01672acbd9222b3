"""Disaster recovery between named clusters (README "Disaster recovery"), shaped like Kafka
MirrorMaker 2: clusters have names (``clusters:`` in the configuration), a task is a flow from
one to another (``source_cluster`` -> ``target_cluster``), and one daemon or fleet runs both
directions.

- :mod:`fence`: stopping writes on a cluster and seeing the stop in effect.
- :mod:`record`: a switchover job as the metastore keeps it (it survives a ``kill -9``).
- :mod:`switchover`: the planned move: check, fence, drain, verify, reverse.
- :mod:`failover`: the unplanned one: stop at once, say what the target holds, export the rest
  (:mod:`failover_export`: the WAL after the saved positions, what its ticks prove).
- :mod:`manager`: the requests, and the jobs a stopped daemon left behind.
- :mod:`task_ops`: what disaster recovery needs of the task lifecycle, as a protocol (the
  supervisor satisfies it; the application wires the two, neither holds the other).
- :mod:`stale_watch`, :mod:`wal_tail`: writes of stale clients, read from the old primary's WAL.
"""

from server.dr.failbacks import FailbackRequest
from server.dr.failover import FailoverRequest
from server.dr.manager import DisasterRecovery, SwitchoverRequest
from server.dr.task_ops import TaskOperations

__all__ = [
    "DisasterRecovery",
    "FailbackRequest",
    "FailoverRequest",
    "SwitchoverRequest",
    "TaskOperations",
]
