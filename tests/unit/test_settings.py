"""Configuration: the documented file, environment overrides, and errors that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from replicator.config.redaction import redacted
from replicator.config.settings import CdcSettings, ConfigError, load_settings

REPO = Path(__file__).resolve().parents[2]
CDC_YAML = REPO / "configs" / "cdc.yaml"


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        keys.add(path)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= _keys(annotation, path + ".")
    return keys


def _yaml_keys(node: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        keys.add(f"{prefix}{key}")
        if isinstance(value, dict):
            keys |= _yaml_keys(value, f"{prefix}{key}.")
    return keys


def test_shipped_file_has_every_key_documented_and_equals_the_defaults():
    text = CDC_YAML.read_text()
    assert _yaml_keys(yaml.safe_load(text)) == _keys(CdcSettings)
    assert load_settings(CDC_YAML, {}) == load_settings(None, {})
    # every key line is preceded by a comment line or sits in a documented block
    lines = text.splitlines()
    undocumented = [
        line.strip()
        for i, line in enumerate(lines)
        if line.strip().endswith(":")
        and not line.startswith(" ")
        and not lines[i - 1].lstrip().startswith("#")
    ]
    assert undocumented == []


def test_go_tool_keys_are_accepted(tmp_path):
    go_style = {
        "address": "0.0.0.0:8444",
        "maxTaskNum": 100,
        "maxNameLength": 256,
        "metaStoreConfig": {
            "storeType": "etcd",
            "etcd": {
                "address": ["http://127.0.0.1:2379"],
                "enableAuth": False,
                "username": "root",
                "password": "root123456",
                "enableTLS": False,
                "tlsCertPath": "deployment/cert/client.pem",
                "tlsKeyPath": "deployment/cert/client.key",
                "tlsCACertPath": "deployment/cert/ca.pem",
            },
            "mysqlSourceUrl": "root:root@tcp(127.0.0.1:3306)/milvus-cdc?charset=utf8",
            "rootPath": "cdc",
        },
        "sourceConfig": {
            "etcd": {
                "address": ["http://127.0.0.1:2379"],
                "rootPath": "by-dev",
                "metaSubPath": "meta",
                "tlsMinVersion": 1.3,
            },
            "etcdRootPath": "by-dev",
            "etcdMetaSubPath": "meta",
            "defaultPartitionName": "_default",
            "readChanLen": 10,
            "pulsar": {
                "address": "pulsar://localhost:6650",
                "webAddress": "localhost:80",
                "maxMessageSize": 5242880,
                "tenant": "public",
                "namespace": "default",
            },
            "kafka": {"address": "127.0.0.1:9092"},
        },
    }
    path = tmp_path / "go.yaml"
    path.write_text(yaml.safe_dump(go_style))
    settings = load_settings(path, {})
    assert settings.sourceConfig.etcd.tlsMinVersion == "1.3"  # YAML's number, as the Go template
    assert settings.metaStoreConfig.storeType == "etcd"
    assert settings.sourceConfig.kafka.address == "127.0.0.1:9092"
    assert settings.sourceConfig.root_path == "by-dev"


def test_environment_overrides_nested_keys_case_insensitively(tmp_path):
    env = {
        "CDC_ADDRESS": "127.0.0.1:9000",
        "CDC_MAXTASKNUM": "7",
        "cdc_metaStoreConfig__storeType": "etcd",
        "CDC_METASTORECONFIG__ETCD__ADDRESS": '["http://10.1.1.1:2379", "10.1.1.2:2379"]',
        "CDC_METASTORECONFIG__ROOTPATH": "123",  # a string key keeps its text
        "CDC_SOURCECONFIG__ETCDROOTPATH": "prod",
        "CDC_CONFIG": str(tmp_path / "none.yaml"),  # names the file, not a key
        "OTHER": "ignored",
    }
    (tmp_path / "none.yaml").write_text("maxTaskNum: 3\nlogLevel: DEBUG\n")
    settings = load_settings(None, env)
    assert settings.host_port == ("127.0.0.1", 9000)
    assert settings.maxTaskNum == 7  # environment beats the file
    assert settings.logLevel == "DEBUG"  # the file beats the defaults
    assert settings.metaStoreConfig.etcd.address == ["http://10.1.1.1:2379", "10.1.1.2:2379"]
    assert settings.metaStoreConfig.rootPath == "123"
    assert settings.sourceConfig.root_path == "prod"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CDC_MAXTASKNUM": "many"}, "maxTaskNum: Input should be a valid integer"),
        ({"CDC_MAXTASKNUM": "0"}, "maxTaskNum: Input should be greater than 0"),
        ({"CDC_NOPE": "1"}, "CDC_NOPE: unknown configuration key 'NOPE'"),
        ({"CDC_METASTORECONFIG__NOPE": "1"}, "unknown configuration key 'METASTORECONFIG.NOPE'"),
        ({"CDC_ADDRESS__X": "1"}, "'address' has no sub-keys"),
        ({"CDC_METASTORECONFIG__STORETYPE": "redis"}, "metaStoreConfig.storeType: Input should be"),
        (
            {"CDC_METASTORECONFIG__STORETYPE": "mysql"},
            "mysqlSourceUrl is required when storeType is mysql",
        ),
        ({"CDC_ADDRESS": "localhost"}, "address: 'localhost' is not host:port"),
        (
            {"CDC_METASTORECONFIG__STORETYPE": "mysql", "CDC_METASTORECONFIG__MYSQLSOURCEURL": "x"},
            "mysqlSourceUrl: expected user:password@tcp(host:port)/database",
        ),
        ({"CDC_METASTORECONFIG__ETCD__ADDRESS": "[]"}, "at least one etcd address is required"),
        ({"CDC_METASTORECONFIG__ETCD__ADDRESS": '["ftp://x:1"]'}, "is not http(s)://host:port"),
        ({"CDC_METASTORECONFIG__ROOTPATH": "a b"}, "metaStoreConfig.rootPath: must be"),
    ],
)
def test_bad_environment_values_name_the_key(env, message):
    with pytest.raises(ConfigError) as error:
        load_settings(None, env)
    assert message in str(error.value)


def test_bad_file_contents_name_the_key(tmp_path):
    path = tmp_path / "cdc.yaml"
    path.write_text("sourceConfig:\n  readChanLen: 10\n  kafak:\n    address: x\n")
    with pytest.raises(ConfigError, match=r"sourceConfig\.kafak: unknown key"):
        load_settings(path, {})
    path.write_text("metaStoreConfig: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"metaStoreConfig: Input should be a valid dictionary"):
        load_settings(path, {})
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_settings(path, {})
    path.write_text("address: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(path, {})
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_settings(tmp_path / "missing.yaml", {})


def test_secret_values_never_echoed_in_errors_or_display():
    with pytest.raises(ConfigError) as error:
        load_settings(
            None, {"CDC_METASTORECONFIG__ETCD__PASSWORD": "x", "CDC_MAXTASKNUM": "s3cr3t"}
        )
    assert "s3cr3t" not in str(error.value)
    settings = load_settings(
        None,
        {
            "CDC_METASTORECONFIG__STORETYPE": "mysql",
            "CDC_METASTORECONFIG__MYSQLSOURCEURL": "root:hunter2@tcp(db:3306)/cdc",
            "CDC_SOURCECONFIG__ETCD__PASSWORD": "hunter3",
            "CDC_SOURCECONFIG__PULSAR__AUTHPARAMS": "token:hunter4",
        },
    )
    shown = str(redacted(settings))
    for secret in ("hunter2", "hunter3", "hunter4"):
        assert secret not in shown
    assert redacted(settings)["metaStoreConfig"]["mysqlSourceUrl"] == "******"


def _cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_serve_stops_at_start_up_on_a_bad_configuration(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("maxTaskNum: lots\n")
    result = _cli("serve", "--config", str(path))
    assert result.returncode == 2
    assert "maxTaskNum: Input should be a valid integer" in result.stderr
    assert "Traceback" not in result.stderr
    result = _cli("serve", env_extra={"CDC_CONFIG": str(path)})
    assert result.returncode == 2
    assert "maxTaskNum" in result.stderr


def test_config_show_prints_the_merged_configuration_redacted():
    result = _cli(
        "config",
        "show",
        env_extra={"CDC_METASTORECONFIG__ETCD__PASSWORD": "hunter5", "CDC_MAXTASKNUM": "5"},
    )
    assert result.returncode == 0, result.stderr
    assert "hunter5" not in result.stdout
    shown = yaml.safe_load(result.stdout)
    assert shown["maxTaskNum"] == 5
    assert shown["metaStoreConfig"]["etcd"]["password"] == "******"


def test_the_interpreter_lock_turn_is_set_from_gil_switch_ms():
    from server.interpreter import tune_interpreter

    before = sys.getswitchinterval()
    try:
        tune_interpreter(load_settings(None, {"CDC_GILSWITCHMS": "20"}))
        assert sys.getswitchinterval() == pytest.approx(0.020)
        tune_interpreter(load_settings(None, {}))  # the default
        assert sys.getswitchinterval() == pytest.approx(0.050)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ConfigError, match="gilSwitchMs"):
        load_settings(None, {"CDC_GILSWITCHMS": "0"})
