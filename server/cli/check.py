"""``milvus-cdc check``: can this daemon's configuration reach what it needs?

- the metastore (``metaStoreConfig``);
- the source etcd (``sourceConfig.etcd``): its version and the collections under the root path;
- the source message queue: Kafka (brokers and the DML channel topics), RocksMQ (the path is a
  RocksDB directory) or Pulsar (a topic lookup);
- targets: one given by ``--target`` (credentials from environment variables), and/or the target
  of a stored task (``--task``, read from the metastore, with its credentials): the Milvus server
  version, over a dedicated channel that is closed afterwards.

Every check has a timeout; every detail is scrubbed of the configured secrets. Exit status 0 when
every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from confluent_kafka.admin import AdminClient
from etcd3.exceptions import Etcd3Exception

from metastore.sealed import secrets_problem
from metastore.tls_files import certificate_expiry
from replicator.config.redaction import secret_values
from replicator.config.secret_keys import open_task_store
from replicator.config.settings import CdcSettings
from replicator.config.stores import (
    describe_metastore,
    etcd_client_for,
    explain_etcd,
    open_metastore,
)
from replicator.config.task_spec import TaskSpec
from replicator.meta.catalog import SourceCatalog
from replicator.sources.kafka import BrokerRefusals
from server.cli.client import secret_from_env
from server.cli.render import table
from server.errors import TargetUnreachableError
from server.tasks.certificates import (
    CertificateWatch,
    ClientCertificate,
    daemon_certificates,
    expiry_warning,
    milvus_certificates,
)
from server.tasks.target_check import check_target_reachable, describe_target

# a target to check, or why it cannot be checked
Target = dict[str, Any] | str


@dataclass
class CheckResult:
    check: str
    target: str
    ok: bool
    version: str = ""
    detail: str = ""


class CheckFailedError(Exception):
    """A check's failure, with what to show."""


# --- the checks (blocking; each runs in a thread under the timeout) ------------------------------
def check_metastore(settings: CdcSettings) -> tuple[str, str]:
    config = settings.metaStoreConfig
    if config.storeType == "sqlite" and not Path(config.sqlitePath).exists():
        return "", f"{config.sqlitePath} does not exist yet (the daemon creates it)"
    store = open_metastore(config)
    try:
        store.ping()
        count = len(store.list_tasks())
        daemons = [m.member_id for m in store.members()]
    finally:
        store.close()
    if config.storeType == "sqlite":
        fleet = "one daemon per database file"
    else:
        fleet = f"{len(daemons)} daemon(s) running on it" + (
            f": {', '.join(daemons)}" if daemons else ""
        )
    return "", f"{count} task(s); {fleet}"


def check_source_etcd(settings: CdcSettings, timeout: float) -> tuple[str, str]:
    source = settings.sourceConfig
    try:
        client = etcd_client_for(source.etcd, timeout=timeout)
        try:
            version = str(client.status().version)
            catalog = SourceCatalog(client, source.root_path, source.meta_sub_path)
            collections = catalog.collections()
        finally:
            client.close()
    except (Etcd3Exception, grpc.RpcError) as exc:
        raise CheckFailedError(str(explain_etcd(source.etcd, exc))) from None
    live = sum(1 for c in collections.values() if not c.dropped)
    return (
        f"etcd {version}",
        f"{live} collection(s) under {source.root_path}/{source.meta_sub_path}",
    )


def check_source_queue(settings: CdcSettings, timeout: float) -> tuple[str, str]:
    source = settings.sourceConfig
    channels = [*source.dml_channels, source.replicate_channel]
    kind = source.mq_type
    if kind == "kafka":
        # log_level 0: librdkafka's own connection errors would flood stderr; the result says it
        refusals = BrokerRefusals()  # SASL or certificates: the reason, else only "all down"
        config: dict[str, Any] = {
            **source.kafka.client_config(),
            "log_level": 0,
            "error_cb": refusals,
        }
        admin = AdminClient(config)
        try:
            metadata = admin.list_topics(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException and friends: not reachable
            admin.poll(0)
            told = refusals.explain(exc)
            raise CheckFailedError(f"kafka {source.kafka.address}: {told}") from None
        present = sum(1 for ch in channels if ch in metadata.topics)
        return "", (
            f"kafka {source.kafka.address}: {len(metadata.brokers)} broker(s), "
            f"{present}/{len(channels)} channel topics present"
        )
    if kind == "rocksmq":
        path = Path(source.rocksmq.path)
        if not (path / "CURRENT").is_file():
            raise CheckFailedError(f"rocksmq {path}: no RocksDB directory there (no CURRENT file)")
        return "", f"rocksmq {path}: RocksDB directory present"
    from replicator.sources.pulsar import PulsarSource

    pulsar_settings = source.pulsar
    try:  # the readers' own client: the same authentication and TLS
        client = PulsarSource(**pulsar_settings.source_kwargs()).new_client(timeout)
    except Exception as exc:  # noqa: BLE001 - a setting pulsar-client refuses
        raise CheckFailedError(f"pulsar {pulsar_settings.address}: {exc}") from None
    try:
        topic = f"persistent://{pulsar_settings.tenant}/{pulsar_settings.namespace}/{channels[0]}"
        client.get_topic_partitions(topic)
    except Exception as exc:  # noqa: BLE001 - pulsar raises its own kinds
        raise CheckFailedError(f"pulsar {pulsar_settings.address}: {exc}") from None
    finally:
        client.close()
    return "", f"pulsar {pulsar_settings.address}: topic lookup answered"


def check_target(connect: dict[str, Any]) -> tuple[str, str]:
    try:
        return f"milvus {check_target_reachable(connect)}", ""
    except TargetUnreachableError as exc:
        raise CheckFailedError(exc.message.removeprefix("milvus_connect_param: ")) from None


def check_kafka_target(param: dict[str, Any], timeout: float) -> tuple[str, str]:
    """A Kafka target's brokers answer; whether its topics exist yet (a broker that creates
    topics on first use makes them with the first event)."""
    from replicator.errors import TargetUnavailableError
    from replicator.sinks.kafka_positions import DEFAULT_POSITIONS_TOPIC, probe

    try:
        topics = set(probe(param, timeout))
    except TargetUnavailableError as exc:
        raise CheckFailedError(str(exc)) from None
    wanted = [param["topic"], param.get("positions_topic") or DEFAULT_POSITIONS_TOPIC]
    if param.get("ddl_topic"):
        wanted.append(param["ddl_topic"])
    named = [t for t in wanted if "{" not in t]
    missing = [t for t in named if t not in topics]
    detail = f"topics missing (made on first use if the broker allows): {', '.join(missing)}"
    return "kafka", detail if missing else "topics present"


def _certificate(watch: CertificateWatch, cert: ClientCertificate) -> Callable[[], tuple[str, str]]:
    """A client certificate's expiry: failed once expired, a warning within the warning's
    reach (``scheduler.certificateWarningDays``)."""

    def check() -> tuple[str, str]:
        expiry = certificate_expiry(cert.path)
        if expiry is None:
            raise CheckFailedError(f"{cert.path}: no certificate can be read there")
        now = time.time()
        if expiry.expired(now):
            raise CheckFailedError(expiry_warning(cert, expiry, now))
        if watch.due(cert, now) is not None:
            return "", f"WARNING: {expiry_warning(cert, expiry, now)}"
        return "", f"{cert.path} expires at {expiry.when}"

    return check


# --- running them --------------------------------------------------------------------------------
def _target_connect(args: argparse.Namespace) -> dict[str, Any]:
    connect: dict[str, Any] = {"uri": args.target, "connect_timeout": max(1, int(args.timeout))}
    if args.token_env:
        connect["token"] = secret_from_env(args.token_env)
    elif args.username:
        connect["username"] = args.username
        connect["password"] = secret_from_env(args.password_env) if args.password_env else ""
    return connect


def _task_targets(settings: CdcSettings, task_ids: list[str]) -> list[tuple[str, Target]]:
    """(name, connect param or the reason it cannot be checked) per stored task."""
    from server.tasks.cluster_target import as_configured  # a named target: as configured

    store = open_task_store(settings)  # the targets' passwords are stored sealed
    try:
        found: list[tuple[str, Target]] = []
        for task_id in task_ids:
            task = store.get_task(task_id)
            problem = None if task is None else secrets_problem(store, task)
            if task is None:
                found.append((f"target of task {task_id}", "no such task in the metastore"))
            elif problem is not None:
                found.append((f"target of task {task_id}", problem))
            elif (spec := as_configured(TaskSpec.of(task), settings)).is_kafka:
                found.append((f"target of task {task_id}", {"kafka": spec.target_param}))
            else:
                found.append((f"target of task {task_id}", spec.target_param))
        return found
    finally:
        store.close()


def run_checks(args: argparse.Namespace, settings: CdcSettings) -> list[CheckResult]:
    timeout = args.timeout
    source = settings.sourceConfig
    planned: list[tuple[str, str, Callable[[], tuple[str, str]] | str]] = [
        (
            "metastore",
            describe_metastore(settings.metaStoreConfig),
            lambda: check_metastore(settings),
        ),
        (
            "source etcd",
            ", ".join(source.etcd.address),
            lambda: check_source_etcd(settings, timeout),
        ),
        ("source queue", source.mq_type, lambda: check_source_queue(settings, timeout)),
    ]
    secrets = secret_values(settings)
    targets: list[tuple[str, Target]] = []
    if args.target:
        targets.append(("target", _target_connect(args)))
    if args.task:
        targets += _task_targets(settings, args.task)
    for name, connect in targets:
        if isinstance(connect, str):
            planned.append((name, "", connect))
            continue
        if "kafka" in connect:
            kafka = connect["kafka"]
            secrets.append(str((kafka.get("sasl") or {}).get("password") or ""))
            where = f"kafka://{kafka['address']}/{kafka['topic']}"
            planned.append((name, where, functools.partial(check_kafka_target, kafka, timeout)))
            continue
        connect = {**connect, "connect_timeout": min(connect["connect_timeout"], timeout)}
        secrets += [connect.get("password") or "", connect.get("token") or ""]
        planned.append((name, describe_target(connect), functools.partial(check_target, connect)))
    if targets:
        import pymilvus  # noqa: F401 - imported here: concurrent first imports in threads deadlock

    certificates = daemon_certificates(settings)
    for _, connect in targets:
        if isinstance(connect, dict) and "kafka" not in connect:
            certificates += milvus_certificates(connect)
    watch = CertificateWatch(settings.scheduler.certificateWarningDays)
    for cert in dict.fromkeys(certificates):
        planned.append(("certificate", f"{cert.role} {cert.endpoint}", _certificate(watch, cert)))

    results = []
    pool = ThreadPoolExecutor(max_workers=len(planned))
    futures = [
        (name, where, pool.submit(job) if callable(job) else job) for name, where, job in planned
    ]
    try:
        for name, where, future in futures:
            if isinstance(future, str):
                results.append(CheckResult(name, where, False, detail=future))
                continue
            try:
                version, detail = future.result(timeout=timeout + 5)
            except FutureTimeout:
                results.append(CheckResult(name, where, False, detail=f"no answer in {timeout} s"))
            except Exception as exc:  # noqa: BLE001 - any failure is the check's result
                text = (
                    str(exc)
                    if isinstance(exc, CheckFailedError)
                    else f"{type(exc).__name__}: {exc}"
                )
                results.append(CheckResult(name, where, False, detail=_scrub(text, secrets)))
            else:
                results.append(CheckResult(name, where, True, version, _scrub(detail, secrets)))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a check past its timeout is abandoned
    return results


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "******")
    return text[:500]


def run_check_command(args: argparse.Namespace, settings: CdcSettings, out: TextIO) -> int:
    results = run_checks(args, settings)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2), file=out)
    else:
        table(
            ["CHECK", "TARGET", "RESULT", "VERSION", "DETAIL"],
            [[r.check, r.target, "ok" if r.ok else "FAILED", r.version, r.detail] for r in results],
            out,
        )
    return 0 if all(r.ok for r in results) else 1
