"""The daemon's side of a verify on Spark: a large collection's range digests computed by the
driver process :mod:`spark_digests`, launched as the backfill's driver is (this interpreter,
under ``setpriv --pdeathsig KILL`` when the host has it, in a session of its own whose process
group is killed at the end, the work with its secrets on stdin), and brought back to the daemon.

Only the digests run on Spark; the ranges whose digests differ (or whose read was not sure) are
then compared by the daemon as every range is in-process (:mod:`verify`): read as rows, then read
again once the task applied what was written before (the "no false alarm under writes" rule).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicator.backfill.phase import driver_environment, kill_group, terminate_group
from replicator.backfill.state import CollectionPlan
from replicator.compare.digest import Digest
from replicator.compare.reader import Schema
from replicator.compare.spark_digests import MARKER, decode

POLL_SECONDS = 0.5

# per range index: (source digest, target digest), None for a side whose read was not sure
RangeDigests = dict[int, tuple[Digest | None, Digest | None]]


class SparkVerifyError(RuntimeError):
    """The Spark driver failed; the message says how and where its log is."""


@dataclass(frozen=True)
class SparkDigests:
    """How to run a collection's digests on Spark, and from how many rows on."""

    min_rows: int  # collections with fewer planned rows stay in the daemon; 0: never Spark
    master: str
    spark_conf: dict[str, str] = field(default_factory=dict)
    log_dir: str = "data/backfill"
    python: str = sys.executable

    def wanted(self, plan: CollectionPlan) -> bool:
        return self.min_rows > 0 and plan.rows >= self.min_rows

    def command(self) -> list[str]:
        argv = [self.python, "-m", "replicator.compare.spark_digests"]
        setpriv = shutil.which("setpriv")
        return argv if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--", *argv]

    def run(
        self,
        task_id: str,
        plan: CollectionPlan,
        schema: Schema,
        sides: tuple[dict[str, Any], dict[str, Any]],
        batch_rows: int,
        seen_ts: int,
        stop: threading.Event,
    ) -> RangeDigests | None:
        """Both sides' digests of every range of ``plan``, every read seeing the writes up to
        ``seen_ts``; None when stopped first."""
        ref = plan.collection
        works = [
            {
                "source": sides[0],
                "target": sides[1],
                "db": ref.db,
                "name": ref.name,
                "target_db": ref.target_db,
                "target_name": ref.target_name,
                "pk": schema.pk,
                "kinds": dict(schema.kinds),
                "range": key_range.to_json(),
                "batch_rows": batch_rows,
                "seen_ts": seen_ts,
            }
            for key_range in plan.ranges
        ]
        request = {
            "spark_conf": {"spark.master": self.master, **self.spark_conf},
            "app_name": f"milvus-cdc-verify-{task_id}",
            "works": works,
        }
        log_path = Path(self.log_dir) / f"{task_id}-verify.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        answer = self._drive(json.dumps(request).encode(), log_path, stop)
        if answer is None:
            return None
        lines = [line for line in answer.splitlines() if line.startswith(MARKER)]
        if not lines:
            raise SparkVerifyError(f"the Spark verify driver answered nothing; see {log_path}")
        found = json.loads(lines[-1][len(MARKER) :])["ranges"]
        return {int(r["index"]): (decode(r["source"]), decode(r["target"])) for r in found}

    def _drive(self, request: bytes, log_path: Path, stop: threading.Event) -> str | None:
        """Run the driver with ``request`` on stdin; its stdout, or None when stopped."""
        with (
            driver_environment(self.log_dir, log_path.stem, self.python, self.spark_conf) as env,
            open(log_path, "ab") as log_file,
            tempfile.TemporaryFile() as out,
        ):
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.command(),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=log_file,
                env=env,
                start_new_session=True,  # its JVM and Python workers share its process group
            )
            try:
                assert process.stdin is not None
                try:
                    process.stdin.write(request)
                    process.stdin.close()
                except BrokenPipeError:
                    pass
                while True:
                    try:
                        code = process.wait(timeout=POLL_SECONDS)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if stop.is_set():
                        terminate_group(process)
                        return None
            finally:
                kill_group(process.pid)  # what the driver left behind (a JVM, Python workers)
            if code != 0:
                raise SparkVerifyError(
                    f"the Spark verify driver exited with code {code}; see {log_path}"
                )
            out.seek(0)
            return out.read().decode(errors="replace")
