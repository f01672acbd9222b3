"""What a Kafka source says when the brokers turn it away: librdkafka's text, without the
timing and repeat count it appends, so the reason reads the same at every attempt."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from replicator.sources.kafka import BrokerRefusals

REFUSAL = (
    "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
    "certificate verify failed: broker certificate could not be verified, verify that "
    "ssl.ca.location is correctly configured or root CA certificates are installed "
    "(install ca-certificates package)"
)


@pytest.mark.parametrize(
    "suffix",
    [
        "",
        " (after 2ms in state SSL_HANDSHAKE)",
        " (after 2ms in state SSL_HANDSHAKE, 1 identical error(s) suppressed)",
        " (after 10010ms in state AUTH_REQ, 558 identical error(s) suppressed)",
    ],
)
def test_a_refusal_is_kept_without_librdkafkas_timing_and_repeat_count(suffix: str) -> None:
    refusals = BrokerRefusals()
    refusals(KafkaError(KafkaError._SSL, REFUSAL + suffix))
    assert refusals.last == REFUSAL
    assert refusals.explain("all broker connections are down") == REFUSAL


def test_other_errors_are_not_taken_for_a_refusal() -> None:
    refusals = BrokerRefusals()
    refusals(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:9093/bootstrap: Connection refused"))
    assert refusals.last == ""
    assert refusals.explain("all broker connections are down") == "all broker connections are down"
    # a text that only looks like the timing in the middle stays whole
    middle = "SASL authentication error (after 2ms in state AUTH_REQ) retried"
    refusals(KafkaError(KafkaError._AUTHENTICATION, middle))
    assert refusals.last == middle
