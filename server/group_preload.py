"""Imported by the fork server that makes the channel groups' processes
(:mod:`server.tasks.group_process`), once, before it forks any (here, not in ``server.tasks``,
whose package imports everything before a module of it runs): everything a group runs, the
WAL readers a group opens on demand among it, so a group's process starts with its modules
in place (a fork, milliseconds) instead of importing them (a second of CPU each, in every
group at every start). What it imported is then frozen out of the collector's reach
(``gc.freeze``): a group's collections do not walk it, nor write to its pages, which stay
shared with the fork server's.

Nothing here opens a connection or starts a thread: the fork server must stay a process of
one thread for its forks to be safe (a fork copies only the thread that forks: a lock another
thread held would be held for ever in the child). Two libraries a group imports start one at
import unless told not to, before they are imported: numpy's OpenBLAS a pool of workers (a
group does no linear algebra) and pyarrow's jemalloc a background purger (a group allocates
nothing through Arrow). Both settings are the fork server's and its groups' only (the daemon
keeps its environment).
"""

from __future__ import annotations

import gc
import importlib
import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"
# jemalloc's options are a list: a later one wins
arrow_malloc = [os.environ.get("JE_ARROW_MALLOC_CONF", ""), "background_thread:false"]
os.environ["JE_ARROW_MALLOC_CONF"] = ",".join(filter(None, arrow_malloc))

# after the settings above, which they read as they load
for module in (
    "replicator.sources.kafka",  # the WAL readers a group opens on demand
    "replicator.sources.rocksmq",
    "server.tasks.engine",  # the context builder a group is given, and all it uses
    "server.tasks.group_process",  # the group's body
):
    importlib.import_module(module)

gc.collect()
gc.freeze()
