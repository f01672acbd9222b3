"""What a Spark driver of the daemon's inherits of its environment: an allow-list, never a
``CDC_`` variable (the end-to-end check reads ``/proc`` of a real driver and JVM:
tests/e2e/test_backfill_environment.py)."""

from __future__ import annotations

import pytest

from replicator.backfill.child_env import child_environment
from replicator.config.settings import ConfigError, load_settings


def test_only_the_machines_javas_sparks_and_pythons_variables_are_inherited():
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/home/cdc",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "JAVA_HOME": "/usr/lib/jvm/java",
        "SPARK_HOME": "/opt/spark",
        "SPARK_SUBMIT_OPTS": "-Dx=1",
        "PYSPARK_PYTHON": "/venv/bin/python",
        "PYTHONPATH": "/src",
        "HADOOP_CONF_DIR": "/etc/hadoop",
        "no_proxy": "127.0.0.1",
        "HTTPS_PROXY": "http://proxy:3128",
        "CDC_SECRETS": "{key: 'k1:AAAA'}",
        "CDC_METASTORECONFIG": "{mysqlSourceUrl: 'root:pw@tcp(h)/db'}",
        "CDC_CLUSTERS": "{a: {milvus: {password: pw}}}",
        "CDC_AUTH": "{tokens: []}",
        "CDC_TOKEN": "t",
        "cdc_sourceConfig__milvus__password": "pw",
        "AWS_SECRET_ACCESS_KEY": "another program's",
        "MILVUS_PASSWORD": "x",
        "path": "lower case is another variable",
    }
    assert sorted(child_environment(environ)) == [
        "HADOOP_CONF_DIR",
        "HOME",
        "HTTPS_PROXY",
        "JAVA_HOME",
        "LANG",
        "LC_ALL",
        "PATH",
        "PYSPARK_PYTHON",
        "PYTHONPATH",
        "SPARK_HOME",
        "SPARK_SUBMIT_OPTS",
        "no_proxy",
    ]


def test_a_named_clusters_password_is_refused_as_a_variable_and_read_as_a_section():
    """README: a ``CDC_CLUSTERS__...`` password is refused; the whole section as one variable
    is read (and removed from the environment by serve, never inherited by a driver)."""
    with pytest.raises(ConfigError, match="CDC_CLUSTERS__A__MILVUS__PASSWORD: 'clusters' has"):
        load_settings(environ={"CDC_CLUSTERS__A__MILVUS__PASSWORD": "pw"})
    section = "{a: {milvus: {uri: 'http://h:19530', password: s3cr3t}}}"
    settings = load_settings(environ={"CDC_CLUSTERS": section})
    assert settings.clusters["a"].milvus.password.get_secret_value() == "s3cr3t"
    assert child_environment({"CDC_CLUSTERS": section}) == {}
