"""``python -m server.demo``: the embedded walk-through (see :mod:`server.demo.walkthrough`)."""

import sys

from server.demo.walkthrough import main

sys.exit(main())
