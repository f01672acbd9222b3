"""``milvus-cdc task switchover|failover|failback``: the disaster-recovery requests from the
command line (docs/concepts/disaster-recovery.md). ``switchover --follow`` prints each step of
the job until it is done (exit 0) or failed (exit 1, with the reason and whether it was rolled
back); ``failback --follow`` until A is in sync with B (exit 0) or the failback failed (1)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO

from server.cli.client import DaemonClient, quote_task_id
from server.cli.render import announce_job, follow_job, switchover_line

Action = Callable[[str, str], argparse.ArgumentParser]


def add_dr_parsers(action: Action) -> None:
    switchover = action(
        "switchover",
        "move production to the task's target cluster: fence, drain, verify, reverse the flow",
    )
    switchover.add_argument(
        "--max-lag", type=float, default=30.0, metavar="S", help="refused above this lag (30)"
    )
    switchover.add_argument(
        "--job-timeout", type=float, default=600.0, metavar="S", help="rolls back after (600)"
    )
    switchover.add_argument(
        "--fence",
        choices=("etcd", "operator"),
        default="etcd",
        help="etcd: the job stops writes on the source; operator: you stopped the writers and "
        "the job waits for the source's WAL to be quiet",
    )
    switchover.add_argument(
        "--stale-check",
        type=float,
        default=60.0,
        metavar="S",
        help="compare the old primary with the new one this long after the switchover, for "
        "stale writes (60; 0: no check)",
    )
    switchover.add_argument("--follow", action="store_true", help="print each step until it ends")
    failback = action(
        "failback",
        "re-seed a failed-over task's old source from its target, until both are equal",
    )
    failback.add_argument("--follow", action="store_true", help="print each step until it ends")
    failover = action(
        "failover", "the source is lost: stop the task, say what the target holds, export the rest"
    )
    failover.add_argument(
        "--export-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="how long the export may read the source's WAL (0: none; default 60)",
    )


def failback_line(job: dict[str, Any]) -> str:
    """``failback of ab: repairing (reverse task ab-back-1f2e; 12 repaired)``"""
    facts = [f"reverse task {job.get('reverse_task_id')}"]
    if job.get("repaired"):
        facts.append(f"{job['repaired']} repaired")
    if job.get("reason"):
        facts.append(job["reason"])
    return f"failback of {job.get('task_id')}: {job.get('state', '-')} ({'; '.join(facts)})"


def run_dr_command(client: DaemonClient, args: argparse.Namespace, out: TextIO) -> int:
    path = f"/v1/tasks/{quote_task_id(args.task_id)}/{args.task_command}"
    if args.task_command == "failback":
        answer = client.call("POST", path, {})
        if not args.follow:
            return announce_job(
                {**answer, "job_id": answer["reverse_task_id"]}, args, "failback", out
            )
        return follow_job(
            client, args.task_id, "failback", failback_line, out, finished=("in_sync", "failed")
        )
    if args.task_command == "failover":
        answer = client.call("POST", path, {"export_seconds": args.export_seconds})
        if args.json:
            print(json.dumps(answer, indent=2), file=out)
            return 0
        up_to = (answer.get("consistent_up_to") or {}).get("time", "unknown")
        print(
            f"task {args.task_id} failed over; the target holds every write up to {up_to}", file=out
        )
        unapplied = (answer.get("unapplied_from") or {}).get("time")
        if unapplied:
            print(f"the first write it lacks is from {unapplied}", file=out)
        if not answer.get("complete"):
            print("the source's WAL was not read to its end: the figure is the saved one", file=out)
        export = answer.get("unreplicated")
        if export:
            print(f"{export['records']} row change(s) it lacks, in {export['file']}", file=out)
            for collection, kinds in export["by_collection"].items():
                counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
                print(f"  {collection}: {counts}", file=out)
            for problem in export["problems"]:
                print(f"  not read: {problem}", file=out)
        return 0
    body = {
        "max_lag_seconds": args.max_lag,
        "timeout_seconds": args.job_timeout,
        "fence": args.fence,
        "stale_check_seconds": args.stale_check,
    }
    answer = client.call("POST", path, body)
    if not args.follow:
        return announce_job(answer, args, "switchover", out)
    return follow_job(
        client, args.task_id, "switchover", switchover_line, out, job_id=answer["job_id"]
    )
