"""Upgrades from every earlier release, installed from git history, under a writer.

Per earlier release (0.1.0, 0.2.0, 0.3.0: exported from its commit and, with ``--venvs``,
installed into a virtualenv of its own) and per store (SQLite, MariaDB, etcd), on one stream
(a Milvus 2.6 source on the librdkafka mock written all along by a writer thread: inserts,
upserts, deletes) into Milvus Lite:

1. **old**: the earlier release on a fresh store; two tasks running (one with a target password,
   one with a target token) and one paused; the writer writes.
2. **rolling** (releases with a fleet, 0.2.0 on, on MariaDB and etcd): this release joins the
   old one in one fleet on the same store for ``--rolling-seconds``; the Running tasks spread
   over both members.
3. **take-over**: the old release stopped (SIGTERM) under the writer; this release (started
   then, or already running) runs every task.
4. The writer stopped; the target must equal what the writer wrote (every key once, every tag
   the last written); every task in its state; each running task's positions past where the old
   release left them; the secrets opened with the key file (0.1.0: this release sealed them).
5. **downgrade**: this release stopped; the earlier release started again on the store (now in
   format 2) under the writer, and what it does recorded as it is.
6. **a newer format**: the store's record set to format 3 (as a future release with a breaking
   step would leave it), then the earlier release and this one started on it: what each does.

    python bench/upgrade.py [--releases 0.1.0,0.2.0,0.3.0] [--stores sqlite,mysql,etcd]
        [--venvs DIR] [--rolling-seconds 20] [--out bench/results/upgrade.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from harness.daemon import Daemon  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.services import (  # noqa: E402
    ServiceStartError,
    etcd_server,
    mariadb_server,
    milvus_lite_server,
    wait_until,
)
from harness.streaming_writer import StreamingWriter  # noqa: E402
from harness.upgrade_stream import PASSWORD, TOKEN, Stream  # noqa: E402
from releases import (  # noqa: E402
    RELEASES,
    create_task,
    daemon_config,
    export_release,
    install_release,
    release_daemon,
    supports,
    wait_rows,
)

from metastore import MetaStore, StoreFormat  # noqa: E402
from metastore.etcd import EtcdMetaStore  # noqa: E402
from metastore.etcd_connect import connect_etcd  # noqa: E402
from metastore.sealed import SealedMetaStore  # noqa: E402
from metastore.sql import SqlMetaStore  # noqa: E402
from metastore.sql_urls import mysql_url_from_source, sqlite_url  # noqa: E402
from replicator.config.secret_keys import KeyFile  # noqa: E402
from replicator.sources.kafka import decode_offset  # noqa: E402

COLLECTIONS = {"a": 72001, "b": 72002, "paused": 72003}
LEASE, CHECK = 4.0, 0.5


class Writer(threading.Thread):
    """Writes batches into the running tasks' collections every ``period`` s: 10 new keys each,
    every 4th batch an upsert of 5 earlier keys, every 6th a delete of 3."""

    def __init__(self, streams: list[Stream], period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.streams, self.period = streams, period
        self.stop_event = threading.Event()
        self.batches = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                n = self.batches
                for stream in self.streams:
                    first = 1000 + n * 10
                    stream.insert(first, first + 10)
                    if n % 4 == 3:
                        stream.upsert(range(first - 30, first - 25), f"up{n}")
                    if n % 6 == 5:
                        stream.delete(range(first - 50, first - 47))
                self.batches += 1
                self.stop_event.wait(self.period)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.failure = exc

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        if self.failure is not None:
            raise RuntimeError(f"the writer failed: {self.failure!r}")


@dataclass
class Outcome:
    release: str
    store: str
    rows: dict[str, int] = field(default_factory=dict)
    exact: bool = False
    states_kept: bool = False
    positions_kept: bool = False
    secrets_readable: bool = False
    gap_seconds: float = 0.0
    rolling: str = "-"
    downgrade: str = ""
    future: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class Services:
    def __init__(self, stack: ExitStack, scratch: Path) -> None:
        self.etcd = stack.enter_context(etcd_server(scratch / "etcd"))
        self.mariadb = stack.enter_context(mariadb_server(scratch / "mariadb"))
        self.kafka = stack.enter_context(kafka_mock_cluster(scratch / "kafka"))
        self.lite = stack.enter_context(milvus_lite_server(scratch / "lite"))

    def store_config(self, kind: str, workdir: Path, root: str) -> dict[str, Any]:
        if kind == "sqlite":
            return {"storeType": "sqlite", "sqlitePath": str(workdir / "meta.db")}
        if kind == "etcd":
            return {
                "storeType": "etcd",
                "etcd": {"address": [self.etcd.endpoint]},
                "rootPath": root,
            }
        return {"storeType": "mysql", "mysqlSourceUrl": self.mariadb.go_dsn, "rootPath": root}

    def open_store(self, kind: str, workdir: Path, root: str) -> MetaStore:
        if kind == "sqlite":
            return SqlMetaStore(sqlite_url(str(workdir / "meta.db")), "cdc")
        if kind == "etcd":
            return EtcdMetaStore(connect_etcd([self.etcd.endpoint]), root)
        return SqlMetaStore(mysql_url_from_source(self.mariadb.go_dsn), root)


def fleet_config(release: str, member: str, rolling: bool) -> dict[str, Any]:
    if not rolling or not supports(release, "fleet"):
        return {}
    return {"fleet": {"leaseSeconds": LEASE, "checkSeconds": CHECK, "memberId": member}}


def offsets_in_store(store: MetaStore, task_id: str) -> dict[str, int]:
    return {
        channel: decode_offset(p.msg_id)
        for channel, p in store.get_positions(task_id).items()
        if len(p.msg_id) == 8
    }


def run_one(
    release: str,
    kind: str,
    services: Services,
    scratch: Path,
    venvs: Path | None,
    rolling_seconds: float,
) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(release, kind)
    tree = export_release(RELEASES[release], scratch / f"release-{release}")
    python = install_release(tree, venvs / release) if venvs else None
    tag = f"u{release.replace('.', '')}{kind}{uuid.uuid4().hex[:4]}"
    workdir = scratch / tag
    root = f"upgrade-{tag}"
    writer = StreamingWriter(services.kafka.bootstrap)
    streams = {role: Stream(writer, tag, collection_id=cid) for role, cid in COLLECTIONS.items()}
    streams["a"].tick_all()
    store = services.store_config(kind, workdir, root)
    source = streams["a"].source_config(services.etcd.endpoint, services.kafka.bootstrap)
    rolling = kind != "sqlite" and supports(release, "fleet")

    def config_of(of_release: str, member: str) -> dict[str, Any]:
        config = daemon_config(of_release, store, source, workdir)  # one key file for both
        return {**config, **fleet_config(of_release, member, rolling)}

    old = release_daemon(workdir / "old", config_of(release, "old"), tree, python).start(90)
    new = release_daemon(workdir / "new", config_of("0.4.0", "new"), None)
    names = {role: f"{role}_{tag}" for role in COLLECTIONS}
    tasks = {
        "a": create_task(old, services.lite.uri, names["a"], password=PASSWORD),
        "b": create_task(old, services.lite.uri, names["b"], token=TOKEN),
        "paused": create_task(old, services.lite.uri, names["paused"], password=PASSWORD),
    }
    for role, cid in COLLECTIONS.items():
        writer.create_collection(cid, names[role], streams[role].vchannels(cid), partition_ids=[1])
    streams["paused"].insert(0, 20)
    live = [streams["a"], streams["b"]]
    for stream in live:
        stream.insert(0, 100)
    wait_rows(services.lite.uri, names["paused"], streams["paused"].expected)
    assert old.call("pause", {"task_id": tasks["paused"]}).code == 200
    w = Writer(live)
    w.start()
    try:
        time.sleep(5)
        if rolling:
            new.start(60)
            outcome.rolling = watch_fleet(old, new, tasks, rolling_seconds)
        store_view = services.open_store(kind, workdir, root)
        before = {t: offsets_in_store(store_view, tasks[t]) for t in ("a", "b")}
        stopped_at = time.monotonic()
        code = old.stop(grace=30)
        if code != 0:
            outcome.notes.append(f"{release} exited {code} at SIGTERM")
        if not rolling:
            new.start(60)
        outcome.gap_seconds = round(time.monotonic() - stopped_at, 1)
        wait_until(lambda: all_running(new, tasks), 60, "every task run by the new release")
        time.sleep(5)
    finally:
        w.finish()
    for stream in live:
        stream.tick_all()
    try:
        for role in ("a", "b"):
            wait_rows(services.lite.uri, names[role], streams[role].expected, timeout=120)
        outcome.exact = True
    except AssertionError as exc:
        outcome.notes.append(str(exc))
    outcome.rows = {role: len(streams[role].expected) for role in ("a", "b")}
    states = {
        role: new.call("get", {"task_id": t}).data["task"]["state"] for role, t in tasks.items()
    }
    outcome.states_kept = states == {"a": "Running", "b": "Running", "paused": "Paused"}
    after = {t: offsets_in_store(store_view, tasks[t]) for t in ("a", "b")}
    outcome.positions_kept = all(
        after[t].get(c, -1) >= o for t in before for c, o in before[t].items()
    ) and all(before[t] for t in before)
    assert new.stop() == 0
    outcome.secrets_readable = secrets_readable(store_view, workdir, tasks)
    if any(s in new.log_text() for s in (PASSWORD, TOKEN)):
        outcome.notes.append("a secret in the new release's log")
    outcome.downgrade = downgrade(release, tree, python, workdir, config_of, live, names, services)
    outcome.future = future_format(release, tree, python, workdir, config_of, store_view)
    store_view.close()
    outcome.seconds = round(time.monotonic() - started, 1)
    return outcome


def all_running(daemon: Daemon, tasks: dict[str, str]) -> bool:
    for role in ("a", "b"):
        task = daemon.call("get", {"task_id": tasks[role]}).data.get("task") or {}
        if task.get("state") != "Running":
            return False
    return True


def watch_fleet(old: Daemon, new: Daemon, tasks: dict[str, str], seconds: float) -> str:
    """Both releases in one fleet for ``seconds``: who ran which task, as the new one sees it."""
    deadline = time.monotonic() + seconds
    owners: set[str] = set()
    members: set[str] = set()
    while time.monotonic() < deadline:
        status, _, fleet = new.request("GET", "/v1/fleet")
        if status == 200:
            members |= {
                f"{m['member_id']} ({m.get('release') or 'release not named'})"
                for m in fleet.get("members") or []
            }
        for role in ("a", "b"):
            task = new.call("get", {"task_id": tasks[role]}).data.get("task") or {}
            if task.get("owner"):
                owners.add(f"{role}@{task['owner']}")
        time.sleep(1)
    if old.process is None or old.process.poll() is not None:
        raise RuntimeError(f"the old member died; log {old.log_path}")
    return f"{seconds:.0f} s; members {', '.join(sorted(members))}; ran {', '.join(sorted(owners))}"


def secrets_readable(store: MetaStore, workdir: Path, tasks: dict[str, str]) -> bool:
    sealed = SealedMetaStore(store, KeyFile(workdir / "cdc-secret.key"))
    expected = {
        "a": ("password", PASSWORD),
        "b": ("token", TOKEN),
        "paused": ("password", PASSWORD),
    }
    for role, (name, secret) in expected.items():
        task = sealed.get_task(tasks[role])
        if task is None or task.spec["milvus_connect_param"].get(name) != secret:
            return False
        raw = store.get_task(tasks[role])
        if raw is None or secret in json.dumps(raw.spec):  # sealed at rest
            return False
    return True


def downgrade(
    release: str,
    tree: Path,
    python: Path | None,
    workdir: Path,
    config_of: Any,
    live: list[Stream],
    names: dict[str, str],
    services: Services,
) -> str:
    """The earlier release started again on the store this release left, under the writer."""
    old = release_daemon(workdir / "old-again", config_of(release, "old"), tree, python)
    try:
        old.start(60)
    except ServiceStartError:
        return f"did not start: {last_words(old)}"
    w = Writer(live)
    w.batches = 10_000  # keys of their own
    w.start()
    time.sleep(5)
    w.finish()
    for stream in live:
        stream.tick_all()
    try:
        for stream, role in zip(live, ("a", "b"), strict=True):
            wait_rows(services.lite.uri, names[role], stream.expected, timeout=90)
        said = "started, ran every task, every row exact"
    except AssertionError as exc:
        said = f"started; rows not exact: {exc}"
    errors = [line for line in old.log_text().splitlines() if '"level": "ERROR"' in line]
    if errors:
        said += f"; {len(errors)} ERROR line(s), first: {errors[0][:200]}"
    code = old.stop(grace=30)
    return said if code == 0 else f"{said}; exited {code}"


def last_words(daemon: Daemon) -> str:
    """The last error the daemon logged (its message alone when the line is JSON)."""
    lines = [line for line in daemon.log_text().splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line] or lines[-1:]
    if not errors:
        return "(nothing logged)"
    try:
        return str(json.loads(errors[-1])["msg"])[:300]
    except (ValueError, KeyError, TypeError):
        return errors[-1].strip()[:300]


def future_format(
    release: str,
    tree: Path,
    python: Path | None,
    workdir: Path,
    config_of: Any,
    store: MetaStore,
) -> str:
    """The store marked as written in a format 3 (as a future release with a breaking step
    would leave it): what the earlier release and this one do at start."""
    assert store.set_store_format(2, StoreFormat(3, "0.5.0"))
    said = []
    for name, daemon in (
        (release, release_daemon(workdir / "old-f3", config_of(release, "old"), tree, python)),
        ("0.4.0", release_daemon(workdir / "new-f3", config_of("0.4.0", "new"), None)),
    ):
        try:
            daemon.start(30)
        except ServiceStartError:
            said.append(f"{name} did not start: {last_words(daemon)}")
            continue
        said.append(f"{name} started (ready: it reads no format record)")
        daemon.stop(grace=30)
    assert store.set_store_format(3, StoreFormat(2, "0.4.0"))  # the store as it was
    return "; ".join(said)


def render(outcomes: list[Outcome], args: argparse.Namespace, seconds: float) -> str:
    lines = [
        "# Upgrades from earlier releases under a writer",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {platform.processor() or '?'},"
        f" Python {platform.python_version()}; {seconds:.0f} s in all. Command:",
        "",
        f"    python bench/upgrade.py --releases {args.releases} --stores {args.stores}"
        + (f" --venvs {args.venvs}" if args.venvs else "")
        + f" --rolling-seconds {args.rolling_seconds:g}",
        "",
        "Earlier releases run "
        + (
            "from virtualenvs of their own (`pip install` of the export)."
            if args.venvs
            else "from their `git archive` export on PYTHONPATH with this interpreter."
        ),
        "",
        "| release | store | rows a / b | exact | states kept | positions kept | secrets | "
        "gap s | rolling | downgrade (earlier release on the store after) | a format-3 store | "
        "s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    yes = {True: "yes", False: "**no**"}
    for o in outcomes:
        lines.append(
            f"| {o.release} | {o.store} | {o.rows.get('a', 0)} / {o.rows.get('b', 0)} | "
            f"{yes[o.exact]} | {yes[o.states_kept]} | {yes[o.positions_kept]} | "
            f"{yes[o.secrets_readable]} | {o.gap_seconds:g} | {o.rolling} | {o.downgrade} | "
            f"{o.future} | {o.seconds:g} |"
        )
    lines += [
        "",
        "Rolling (both releases in one fleet) runs on MariaDB and etcd, the stores a fleet shares;"
        " 0.1.0 had no fleet. Gap: seconds from the earlier release's SIGTERM until this release"
        " ran (without rolling: started after the stop; rolling: already running).",
    ]
    notes = [f"- {o.release} {o.store}: {n}" for o in outcomes for n in o.notes]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--stores", default="sqlite,mysql,etcd")
    parser.add_argument("--venvs", type=Path, default=None, help="install each release here")
    parser.add_argument("--rolling-seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "upgrade.md")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes = []
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdc-upgrade-")))
        services = Services(stack, scratch)
        for release in args.releases.split(","):
            for kind in args.stores.split(","):
                outcome = run_one(
                    release, kind, services, scratch, args.venvs, args.rolling_seconds
                )
                print(outcome, flush=True)
                outcomes.append(outcome)
    text = render(outcomes, args, time.monotonic() - started)
    args.out.write_text(text)
    print(text)
    ok = all(
        o.exact and o.states_kept and o.positions_kept and o.secrets_readable for o in outcomes
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
