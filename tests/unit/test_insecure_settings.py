"""Every setting that turns a server's certificate check off, or part of it, is named (serve
says each as a warning at every start)."""

from __future__ import annotations

from replicator.config.insecure import insecure_settings
from replicator.config.settings import load_settings


def test_every_setting_that_turns_a_certificate_check_off_is_named():
    assert insecure_settings(load_settings(environ={})) == []
    lax = {"pulsar": {"tlsAllowInsecureConnection": True}}
    settings = load_settings(
        environ={
            "CDC_SOURCECONFIG__KAFKA__SSL": "{enabled: true, verifyHostname: false}",
            "CDC_CLUSTERS": f"{{b: {lax}}}",
        }
    )
    lines = insecure_settings(settings)
    assert [line.split(" is ")[0] for line in lines] == [
        "sourceConfig.kafka.ssl.verifyHostname",
        "clusters.b.pulsar.tlsAllowInsecureConnection",
    ]
