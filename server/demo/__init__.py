"""The embedded demo (``python -m server.demo``, run by ``scripts/run.sh``).

- :mod:`local_milvus`: the Milvus 2.3.5 wheel's binary and Milvus Lite, started as local processes.
- :mod:`processes`: the source, the target and the daemon as child processes, on free ports.
- :mod:`walkthrough`: the walk-through itself, from a source and a target to a matching copy.
"""

from server.demo.processes import MILVUS_ENV_PREFIXES, free_ports
from server.demo.walkthrough import HISTORY_ROWS, backfill_blocker, main

__all__ = ["HISTORY_ROWS", "MILVUS_ENV_PREFIXES", "backfill_blocker", "free_ports", "main"]
