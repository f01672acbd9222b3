"""A Kafka-protocol broker for tests: librdkafka's mock cluster (inside confluent-kafka).

The mock cluster lives exactly as long as the confluent_kafka client that created it, so it runs
in a child process of its own (this file, run as a script): the child creates a client with
``test.mock.num.brokers``, finds the address the mock listens on, writes it to a file in the
working directory and keeps polling until it is stopped (SIGTERM, or its parent dying).

Other processes (the daemon, Milvus itself, confluent_kafka clients in the test process) connect
to that address like to any Kafka: produce, consume, consumer groups, ``assign`` + offsets,
watermarks and headers work; topics are auto-created (4 partitions). Data is in memory only.

Run as a script (``python kafka_mock.py --brokers N --address-file F``) this file imports only
the standard library and confluent_kafka.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ADDRESS_FILE = "kafka-mock.address"
_MOCK_LOG = re.compile(r"Mock cluster enabled: .*replaced with (\S+)")


@dataclass(frozen=True, kw_only=True)
class KafkaMock:
    bootstrap: str  # "127.0.0.1:PORT" (comma-separated when there are several brokers)
    pid: int
    log_path: Path


# --------------------------------------------------------------------------------------------
# The child process


class _CaptureMockAddress(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.address: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = _MOCK_LOG.search(record.getMessage())
        if match:
            self.address = match.group(1).rstrip(".,")


def _serve(brokers: int, address_file: Path) -> None:
    from confluent_kafka import Producer

    stop = False

    def _stop(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    capture = _CaptureMockAddress()
    logger = logging.getLogger("kafka-mock")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(capture)
    logger.addHandler(logging.StreamHandler(sys.stderr))
    logger.propagate = False

    client = Producer(
        {
            "test.mock.num.brokers": brokers,
            "bootstrap.servers": "unused:9092",
            "logger": logger,
        }
    )
    metadata = client.list_topics(timeout=30)
    client.poll(0.1)  # serve the log queue, so the "Mock cluster enabled" line reaches us
    address = capture.address
    if not address:
        address = ",".join(
            f"{broker.host}:{broker.port}" for _id, broker in sorted(metadata.brokers.items())
        )
    tmp = address_file.with_name(address_file.name + ".tmp")
    tmp.write_text(address + "\n", encoding="utf-8")
    os.replace(tmp, address_file)
    print(f"kafka mock cluster ({brokers} broker(s)) on {address}", file=sys.stderr, flush=True)

    while not stop:
        client.poll(0.5)
    print("kafka mock cluster stopping", file=sys.stderr, flush=True)
    client.flush(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--address-file", type=Path, required=True)
    args = parser.parse_args(argv)
    _serve(args.brokers, args.address_file)


# --------------------------------------------------------------------------------------------
# The test-side context manager


def read_address_file(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def _brokers_accept(bootstrap: str) -> bool:
    from harness.services import _port_open

    for address in bootstrap.split(","):
        host, _, port = address.rpartition(":")
        _port_open(int(port), host)
    return True


@contextlib.contextmanager
def kafka_mock_cluster(
    workdir: Path, brokers: int = 1, *, startup_timeout: float = 30.0
) -> Iterator[KafkaMock]:
    """A librdkafka mock Kafka cluster with `brokers` brokers, in a child process of its own."""
    # imported here so that running this file as a script does not need the test harness
    from harness.services import MissingBinaryError, _running, wait_until

    if brokers < 1:
        raise ValueError("brokers must be at least 1")
    if importlib.util.find_spec("confluent_kafka") is None:
        raise MissingBinaryError(
            "the PyPI package confluent-kafka (librdkafka's mock cluster) is not installed; "
            "install the Python test extras (pip install -e '.[test]')"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    address_file = workdir / ADDRESS_FILE
    address_file.unlink(missing_ok=True)
    log_path = workdir / "kafka-mock.log"
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--brokers",
        str(brokers),
        "--address-file",
        str(address_file),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with _running(argv, log_path=log_path, env=env, cwd=workdir, grace=5.0) as process:
        bootstrap = wait_until(
            lambda: read_address_file(address_file),
            startup_timeout,
            f"kafka mock cluster (address file {address_file})",
            process=process,
            log_paths=[log_path],
        )
        wait_until(
            lambda: _brokers_accept(bootstrap),
            startup_timeout,
            f"kafka mock cluster on {bootstrap}",
            process=process,
            log_paths=[log_path],
        )
        yield KafkaMock(bootstrap=bootstrap, pid=process.pid, log_path=log_path)


if __name__ == "__main__":
    main()
