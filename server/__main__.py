"""``python -m server`` is ``milvus-cdc``; with no arguments it serves."""

import sys

from server.cli.main import main

sys.exit(main(default_command="serve"))
