"""The embedded demo (``python -m server.demo``, run by ``scripts/run.sh``).

- :mod:`local_milvus`: the Milvus 2.3.5 wheel's binary and Milvus Lite, started as local processes.
- :mod:`processes`: the source, the target and the daemon as child processes.
- :mod:`ports`: free ports for them (and for the test harness's servers), never handed out twice.
- :mod:`walkthrough`: the walk-through itself, from a source and a target to a matching copy.
"""

from server.demo.ports import free_ports
from server.demo.processes import MILVUS_ENV_PREFIXES
from server.demo.walkthrough import HISTORY_ROWS, backfill_blocker, main

__all__ = ["HISTORY_ROWS", "MILVUS_ENV_PREFIXES", "backfill_blocker", "free_ports", "main"]
