"""``milvus-cdc serve``: run the daemon until it is stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import TextIO

from metastore import MetaStoreError
from replicator.config.insecure import insecure_settings
from replicator.config.redaction import scrub_secret_environment, secret_values
from replicator.config.settings import CdcSettings, ConfigError
from server.daemon import serve
from server.logs import configure_logging


def run_serve_command(_args: argparse.Namespace, settings: CdcSettings, _out: TextIO) -> int:
    redactor = configure_logging(settings.logLevel, settings.logFormat)
    redactor.add(*secret_values(settings))
    scrub_secret_environment(os.environ)  # read: children need not inherit them
    for line in insecure_settings(settings):  # at every start: a choice, never a default
        logging.getLogger("milvus-cdc").warning("insecure setting: %s", line)
    try:
        asyncio.run(serve(settings, redactor))
    except ConfigError as exc:  # found at start: the key file
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 2
    except MetaStoreError as exc:
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 1
    return 0
