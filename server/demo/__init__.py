"""The embedded demo (``python -m server.demo``, run by ``scripts/run.sh``).

- :mod:`local_milvus`: the Milvus 2.3.5 wheel's binary and Milvus Lite, started as local processes.
- :mod:`walkthrough`: the walk-through itself, from a source and a target to a matching copy.
"""

from server.demo.walkthrough import (
    HISTORY_ROWS,
    MILVUS_ENV_PREFIXES,
    backfill_blocker,
    free_ports,
    main,
)

__all__ = ["HISTORY_ROWS", "MILVUS_ENV_PREFIXES", "backfill_blocker", "free_ports", "main"]
