"""The ``milvus-cdc`` command line: ``serve``, ``task ...``, ``check``, ``events``, ``secrets``.

- :mod:`main`: the parser and the console script's entry point (``milvus-cdc``).
- :mod:`client`: the HTTP client of a running daemon, and the errors it raises.
- :mod:`render`: tables and lines the commands print.
- :mod:`tasks`, :mod:`dr`, :mod:`verify`: the ``task`` commands and their job lines.
- :mod:`check`, :mod:`events`, :mod:`secrets`: the commands that work without a daemon.
"""

from server.cli.main import entrypoint, main

__all__ = ["entrypoint", "main"]
