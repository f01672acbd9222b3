"""``milvus-cdc events tail``: read a Kafka target's events, as a consumer with
``isolation.level=read_committed`` sees them, one readable line each (or the JSON itself)."""

from __future__ import annotations

import argparse
import json
import signal
import uuid
from typing import Any, TextIO

from replicator.config.settings import CdcSettings
from server.cli.client import CliError, secret_from_env

LONG_LIST = 6  # lists longer than this (vectors) are shortened in readable lines


def add_events_parser(commands: Any) -> None:
    events = commands.add_parser("events", help="read the events of a Kafka target")
    actions = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    tail = actions.add_parser("tail", help="print a topic's events (read_committed)")
    tail.add_argument("--config", metavar="PATH", help="configuration file")
    tail.add_argument("--brokers", required=True, help="host:9092[,host2:9092]")
    tail.add_argument("--topic", required=True, action="append", help="a topic (repeatable)")
    tail.add_argument(
        "--from-end", action="store_true", help="only events written from now on (with --follow)"
    )
    tail.add_argument("--follow", action="store_true", help="wait for more events (Ctrl-C stops)")
    tail.add_argument("--max", type=int, default=0, help="stop after N events")
    tail.add_argument("--json", action="store_true", help="print each event's JSON as it is")
    tail.add_argument("--username", help="SASL user (with --password-env)")
    tail.add_argument("--password-env", metavar="VAR", help="environment variable with it")
    tail.add_argument("--mechanism", default="PLAIN", help="SASL mechanism (default PLAIN)")
    tail.add_argument(
        "--security-protocol", default="SASL_PLAINTEXT", help="with --username (or SASL_SSL)"
    )


def run_events_command(args: argparse.Namespace, _settings: CdcSettings, out: TextIO) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": args.brokers,
        "group.id": f"milvus-cdc-events-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    }
    if args.username:
        config.update(
            {
                "security.protocol": args.security_protocol,
                "sasl.mechanism": args.mechanism,
                "sasl.username": args.username,
                "sasl.password": secret_from_env(args.password_env) if args.password_env else "",
            }
        )
    consumer = Consumer(config)
    stop = {"now": False}
    previous = signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    try:
        partitions = []
        for topic in args.topic:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise CliError(f"topic {topic}: not found on {args.brokers}")
            start = OFFSET_END if args.from_end else OFFSET_BEGINNING
            partitions += [TopicPartition(topic, p, start) for p in metadata.partitions]
        consumer.assign(partitions)
        open_partitions = {(p.topic, p.partition) for p in partitions}
        shown = 0
        while not stop["now"] and (args.follow or open_partitions):
            for message in consumer.consume(500, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard((message.topic(), message.partition()))
                        continue
                    raise CliError(f"kafka: {error.str()}")
                value = message.value() or b""
                print(value.decode() if args.json else readable(value), file=out, flush=True)
                shown += 1
                if args.max and shown >= args.max:
                    return 0
    finally:
        signal.signal(signal.SIGINT, previous)
        consumer.close()
    return 0


def readable(value: bytes) -> str:
    """One event as a line: time, op, where, key and what changed (vectors shortened)."""
    try:
        event = json.loads(value)
    except ValueError:
        return f"(not an event: {value[:80]!r})"
    if not isinstance(event, dict):
        return f"(not an event: {value[:80]!r})"
    when = (event.get("ts") or {}).get("time") or "-"
    where = f"{event.get('db')}.{event.get('collection') or ''}".rstrip(".")
    op = str(event.get("op"))
    if "row" in event:  # a row event
        if event.get("partition"):
            where += f"[{event['partition']}]"
        text = f"{when}  {op:<7} {where}  pk={json.dumps(event.get('pk'), ensure_ascii=False)}"
        if event.get("row") is not None:
            text += "  " + json.dumps(_shorten(event["row"]), ensure_ascii=False)
        return text
    detail = {k: v for k, v in event.items() if k not in ("op", "db", "collection", "ts", "source")}
    if "schema" in detail:
        fields = detail.pop("schema").get("fields", [])
        detail["fields"] = ",".join(
            f"{f['name']}:{f['type']}{'*' if f.get('primary_key') else ''}" for f in fields
        )
    pairs = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in detail.items())
    return f"{when}  {op} {where}  {pairs}".rstrip()


def _shorten(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shorten(v) for k, v in value.items()}
    if isinstance(value, list) and len(value) > LONG_LIST:
        return [*value[:3], f"...({len(value)})"]
    return value
