"""The Kafka target's positions topic (:mod:`kafka`): made compacted when it is missing, and
read back at a start, ``read_committed``, for what the task committed (its channels' positions
and its :class:`~replicator.sinks.target_model.TargetModel`). With the brokers' client settings
and the probe a target check asks."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka import admin as kafka_admin
from confluent_kafka.admin import AdminClient

from metastore import Position
from replicator.errors import TargetUnavailableError
from replicator.sources.kafka_logs import LibrdkafkaLog

log = logging.getLogger(__name__)

DEFAULT_POSITIONS_TOPIC = "milvus-cdc-positions"
MODEL_KEY = "$model"
READ_STATE_TIMEOUT = 30.0


def client_config(params: dict[str, Any]) -> dict[str, Any]:
    """librdkafka settings for the brokers of a ``kafka_connect_param``."""
    # librdkafka's own lines through the "librdkafka" logger, not on stderr
    config: dict[str, Any] = {"bootstrap.servers": params["address"], "logger": LibrdkafkaLog()}
    if params.get("enable_sasl"):
        sasl = params.get("sasl") or {}
        config.update(
            {
                "security.protocol": sasl.get("security_protocol") or "SASL_PLAINTEXT",
                "sasl.mechanism": sasl.get("mechanism") or "PLAIN",
                "sasl.username": sasl.get("username", ""),
                "sasl.password": sasl.get("password", ""),
            }
        )
    return config


def probe(params: dict[str, Any], timeout: float) -> list[str]:
    """The brokers answer: their topic names (raises ``TargetUnavailableError`` otherwise)."""
    admin = AdminClient({**client_config(params), "socket.timeout.ms": int(timeout * 1000)})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TargetUnavailableError(
            f"kafka {params['address']}: brokers do not answer: {exc.args[0].str()}"
        ) from None
    return sorted(metadata.topics)


def ensure_positions_topic(config: dict[str, Any], positions_topic: str) -> None:
    """A compacted topic of one partition, made when missing; where the broker does not let
    us (or has no controller), its auto-creation is relied on, with a warning."""
    admin = AdminClient(config)
    try:
        metadata = admin.list_topics(timeout=10)
        if positions_topic in metadata.topics:
            return
        if metadata.controller_id not in metadata.brokers:
            # no controller to ask (librdkafka's mock): a create would only time out
            log.info(
                "positions topic %s missing and the brokers name no controller: it is "
                "made on first use",
                positions_topic,
            )
            return
        topic = kafka_admin.NewTopic(  # type: ignore[attr-defined]
            positions_topic, 1, -1, config={"cleanup.policy": "compact"}
        )
        admin.create_topics([topic], request_timeout=5, operation_timeout=5)[
            positions_topic
        ].result(timeout=6)
        log.info("positions topic %s created (compacted)", positions_topic)
    except Exception as exc:  # noqa: BLE001 - the topic may still be auto-created
        log.warning(
            "positions topic %s not created (%s): relying on the broker creating it; "
            "make it compacted (cleanup.policy=compact)",
            positions_topic,
            exc,
        )


def read_state(
    config: dict[str, Any], positions_topic: str, prefix: str, timeout: float
) -> tuple[dict[str, Position], dict[str, Any] | None]:
    """The task's committed positions and model: the last value of each of its keys in the
    positions topic, read with read_committed up to the end it had when we began."""
    address = config["bootstrap.servers"]
    consumer = Consumer(
        {
            **config,
            "group.id": f"milvus-cdc-state-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    positions: dict[str, Position] = {}
    model: dict[str, Any] | None = None
    try:
        metadata = consumer.list_topics(positions_topic, timeout=10)
        topic = metadata.topics.get(positions_topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return positions, None
        ends: dict[int, int] = {}
        for partition in topic.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(positions_topic, partition), timeout=10
            )
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(positions_topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout
        while ends:
            if time.monotonic() > deadline:
                raise TargetUnavailableError(
                    f"kafka {address}: the positions topic {positions_topic} "
                    f"was not read to its end within {timeout:.0f} s (a transaction of "
                    f"another producer open?)"
                )
            for message in consumer.consume(500, 0.5):
                error = message.error()
                partition = message.partition()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise TargetUnavailableError(f"kafka {address}: {error.str()}")
                else:
                    key = (message.key() or b"").decode()
                    if key.startswith(prefix):
                        name = key[len(prefix) :]
                        value = json.loads(message.value() or b"null")
                        if name == MODEL_KEY:
                            model = value["state"]
                        elif value is not None:
                            positions[name] = Position(
                                value["backend"],
                                value["channel"],
                                bytes.fromhex(value["msg_id"]),
                                int(value["ts"]),
                            )
                if partition in ends:
                    (at,) = consumer.position([TopicPartition(positions_topic, partition)])
                    if at.offset >= ends[partition]:
                        del ends[partition]
    except KafkaException as exc:
        raise TargetUnavailableError(f"kafka {address}: {exc.args[0].str()}") from None
    finally:
        consumer.close()
    return positions, model
