"""``milvus-cdc serve``: run the daemon until it is stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable
from typing import TextIO

from metastore import MetaStoreError
from replicator.config.redaction import scrub_secret_environment, secret_values
from replicator.config.settings import CdcSettings, ConfigError, load_settings
from server.daemon import serve
from server.logs import SecretRedactor, configure_logging


def run_serve_command(args: argparse.Namespace, settings: CdcSettings, _out: TextIO) -> int:
    redactor = configure_logging(settings.logLevel, settings.logFormat)
    redactor.add(*secret_values(settings))
    read_passwords_again(settings, args.config, dict(os.environ), redactor)
    scrub_secret_environment(os.environ)  # read: children need not inherit them
    try:
        asyncio.run(serve(settings, redactor))
    except ConfigError as exc:  # found at start: the key file
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 2
    except MetaStoreError as exc:
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 1
    return 0


def read_passwords_again(
    settings: CdcSettings,
    path: str | None,
    environ: dict[str, str],
    redactor: SecretRedactor,
) -> None:
    """Every etcd the daemon logs in to (its metastore, each cluster's source etcd) reads its
    password again from the configuration (the file at ``path``, then the ``CDC_`` variables
    as they were at start) when etcd refuses the one in use: a password rotated on etcd and
    in the file needs no restart. The new one is redacted from the logs like the first."""

    def password_of(cluster: str | None, metastore: bool = False) -> Callable[[], str]:
        def read() -> str:
            again = load_settings(path, environ)
            etcd = again.metaStoreConfig.etcd if metastore else again.cluster(cluster).etcd
            password = etcd.password.get_secret_value()
            redactor.add(password)
            return password

        return read

    if settings.metaStoreConfig.storeType == "etcd":
        settings.metaStoreConfig.etcd.read_password_from(password_of(None, metastore=True))
    for name in [None, *settings.clusters]:
        settings.cluster(name).etcd.read_password_from(password_of(name))
