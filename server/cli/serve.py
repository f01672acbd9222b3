"""``milvus-cdc serve``: run the daemon until it is stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import TextIO, TypeVar

from metastore import MetaStoreError
from replicator.config.insecure import insecure_settings
from replicator.config.milvus_endpoint import SourceMilvusSettings
from replicator.config.redaction import scrub_secret_environment, secret_values
from replicator.config.settings import CdcSettings, ConfigError, load_settings
from server.daemon import serve
from server.logs import SecretRedactor, configure_logging

T = TypeVar("T")


def run_serve_command(args: argparse.Namespace, settings: CdcSettings, _out: TextIO) -> int:
    redactor = configure_logging(settings.logLevel, settings.logFormat)
    redactor.add(*secret_values(settings))
    read_passwords_again(settings, args.config, dict(os.environ), redactor)
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


def read_passwords_again(
    settings: CdcSettings,
    path: str | None,
    environ: dict[str, str],
    redactor: SecretRedactor,
) -> None:
    """Every etcd the daemon logs in to (its metastore, each cluster's source etcd) and a
    MySQL metastore read the password again from the configuration (the file at ``path``, then
    the ``CDC_`` variables as they were at start) when the server refuses the one in use: a
    password rotated there and in the file needs no restart. The new one is redacted from the
    logs like the first. So is each named cluster's Milvus block (a task's ``target_cluster``:
    server/tasks/cluster_target.py), its secrets redacted likewise."""

    def read_again(
        pick: Callable[[CdcSettings], T], secrets: Callable[[T], Iterable[str]]
    ) -> Callable[[], T]:
        def read() -> T:
            value = pick(load_settings(path, environ))
            redactor.add(*secrets(value))
            return value

        return read

    def password_of(pick: Callable[[CdcSettings], str]) -> Callable[[], str]:
        return read_again(pick, lambda password: [password])

    def cluster_milvus(name: str) -> Callable[[CdcSettings], SourceMilvusSettings]:
        return lambda again: again.cluster(name).milvus

    def cluster_etcd(name: str | None) -> Callable[[CdcSettings], str]:
        return lambda again: again.cluster(name).etcd.password.get_secret_value()

    store = settings.metaStoreConfig
    if store.storeType == "etcd":
        store.etcd.read_password_from(
            password_of(lambda again: again.metaStoreConfig.etcd.password.get_secret_value())
        )
    if store.storeType == "mysql":
        store.read_password_from(password_of(_mysql_password))
    for name in [None, *settings.clusters]:
        settings.cluster(name).etcd.read_password_from(password_of(cluster_etcd(name)))
    for name in settings.clusters:
        settings.cluster(name).milvus.read_again_from(
            read_again(cluster_milvus(name), secret_values)
        )


def _mysql_password(settings: CdcSettings) -> str:
    from sqlalchemy.engine import make_url

    from metastore.sql_urls import mysql_url_from_source

    url = mysql_url_from_source(settings.metaStoreConfig.mysqlSourceUrl.get_secret_value())
    return make_url(url).password or ""
