"""``python -m replicator.backfill --task ID``: run a task's backfill job (its Spark driver).

The daemon launches it with its settings on stdin (``--settings-stdin``); by hand, or under
``spark-submit``, give the daemon's configuration file (``--config cdc.yaml``, ``CDC_*``
variables apply as for the daemon). Exit codes: 0 done, 3 a range failed on every attempt (the
reason is in the metastore), 4 no running job, 2 a bad configuration, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from replicator.backfill.job import EXIT_BAD_JOB, JobOptions, run_job
from replicator.backfill.state import BackfillState
from replicator.config.milvus_endpoint import milvus_param
from replicator.config.redaction import secret_values
from replicator.config.secret_keys import open_task_store
from replicator.config.settings import CdcSettings, ConfigError, load_settings
from replicator.config.task_spec import TaskSpec
from replicator.log_context import log_context
from replicator.log_redaction import connect_secrets, redact_root_logging

log = logging.getLogger("replicator.backfill")


def spark_master(master: str, task_max_failures: int) -> tuple[str, dict[str, str]]:
    """The master URL and extra Spark properties for retrying a failed task: local mode
    retries only with ``local[N,F]``; elsewhere ``spark.task.maxFailures`` does it."""
    if master in ("local", "local[*]") or (
        master.startswith("local[") and "," not in master and master.endswith("]")
    ):
        threads = "1" if master == "local" else master[len("local[") : -1]
        return f"local[{threads},{task_max_failures}]", {}
    if master.startswith("local"):
        return master, {}
    return master, {"spark.task.maxFailures": str(task_max_failures)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replicator.backfill")
    parser.add_argument("--task", required=True, help="the task whose backfill job to run")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="the daemon's configuration file")
    source.add_argument(
        "--settings-stdin", action="store_true", help="read the settings as JSON from stdin"
    )
    args = parser.parse_args(argv)

    try:
        if args.settings_stdin:
            settings = CdcSettings(**json.loads(sys.stdin.read()))
        else:
            settings = load_settings(args.config)
    except (ConfigError, ValueError) as exc:
        print(f"milvus-cdc backfill: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.logLevel,
        format="%(asctime)s %(levelname)s %(name)s [task %(task)s] %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    redactor = redact_root_logging(secret_values(settings))
    _add_task_field(args.task)
    store = open_task_store(settings)  # the target's password is stored sealed
    try:
        task = store.get_task(args.task)
        if task is None:
            log.error("task %s not found", args.task)
            return EXIT_BAD_JOB
        try:
            spec = TaskSpec.of(task)
            redactor.add(*connect_secrets(spec.target_param))
            milvus = settings.source_of(spec).milvus
        except KeyError as exc:
            log.error("%s", exc.args[0])
            return EXIT_BAD_JOB
        if not milvus.uri:
            log.error("the task's source has no milvus.uri in the daemon's configuration")
            return EXIT_BAD_JOB
        backfill = settings.backfill
        master, extra = spark_master(backfill.sparkMaster, backfill.taskMaxFailures)
        options = JobOptions(
            source=milvus_param(milvus),
            target=spec.target_param,
            range_rows=backfill.rangeRows,
            batch_rows=backfill.batchRows,
            parallelism=backfill.parallelism,
            spark_conf={
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                **extra,
                **backfill.sparkConf,
            },
        )
        state = BackfillState(store, args.task)
        with log_context(task_id=args.task):
            try:
                return run_job(state, options, master)
            except Exception as exc:
                log.exception("backfill driver failed")
                job = state.job()
                if job is not None:
                    reason = redactor.scrub(f"{type(exc).__name__}: {exc}")
                    state.record_error(job.job_id, reason[:500])
                return 1
    finally:
        store.close()


def _add_task_field(task_id: str) -> None:
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.task = task_id
        return record

    logging.setLogRecordFactory(factory)


if __name__ == "__main__":
    sys.exit(main())
