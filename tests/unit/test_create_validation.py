"""Validation of create requests, selection overlap and the MySQL DSN conversion (no I/O)."""

from __future__ import annotations

import pytest

from metastore.sql_urls import mysql_url_from_source
from replicator.config.settings import load_settings
from replicator.config.task_spec import TaskSpec, target_identity
from replicator.pipeline.selection import TaskSelection, selections_overlap
from server.errors import BadRequestError
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.spec import validate_create

SETTINGS = load_settings(None, {})
TARGET = {"host": "milvus-b", "port": 19530}


def validate(**data):
    data.setdefault("milvus_connect_param", TARGET)
    if "db_collections" not in data:
        data.setdefault("collection_infos", [{"name": "*"}])
    return validate_create(parse_model(CreateRequest, data), SETTINGS).to_stored()


def test_go_client_body_with_empty_structs_and_nulls_is_accepted():
    spec = validate(
        milvus_connect_param={
            "host": "milvus-b",
            "port": 19530,
            "username": "",
            "password": "",
            "enable_tls": False,
            "dial_config": {},
            "connect_timeout": 0,
            "uri": "",
            "token": "",
            "channel_num": 0,
            "ignore_partition": False,
        },
        kafka_connect_param={"address": "", "topic": "", "enable_sasl": False, "sasl": {}},
        collection_infos=[{"name": "*", "positions": None, "use_start_position": False}],
        db_collections=None,
        name_mapping=None,
        positions=None,
        buffer_config={"period": 0, "size": 0},
        extra_info={"enable_user_role": False},
        rpc_channel_info={"name": "", "position": ""},
        task_id="",
    )
    assert spec["milvus_connect_param"]["connect_timeout"] == 10  # 0 means the default
    assert spec["rpc_channel_info"] == {"name": "by-dev-replicate-msg"}
    assert TaskSpec.from_stored(spec).selection == {("default", "*")}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"milvus_connect_param": None}, "milvus_connect_param: required"),
        ({"milvus_connect_param": {"port": 1}}, "give uri, or host and port"),
        ({"milvus_connect_param": {"host": "h"}}, "port: must be between 1 and 65535"),
        ({"milvus_connect_param": {"host": "h", "port": 70000}}, "port: Input should be less"),
        ({"milvus_connect_param": {"host": "h", "uri": "http://h:1"}}, "not both"),
        ({"milvus_connect_param": {"uri": "h:19530"}}, "is not a Milvus address"),
        ({"milvus_connect_param": {"uri": "http://h:port"}}, "is not a Milvus address"),
        (
            {"milvus_connect_param": {**TARGET, "username": "root"}},
            "both username and password",
        ),
        (
            {"milvus_connect_param": {**TARGET, "connect_timeout": 301}},
            "connect_timeout: Input should be less than or equal to 300",
        ),
        (
            {"milvus_connect_param": {**TARGET, "dial_config": {"server_pem_path": "/nope.pem"}}},
            "dial_config.server_pem_path: no readable file at /nope.pem",
        ),
        (
            {"milvus_connect_param": {**TARGET, "port": "19530"}},
            "request_data.milvus_connect_param.port: Input should be a valid integer",
        ),
        (
            {"milvus_connect_param": {**TARGET, "colour": "blue"}},
            "request_data.milvus_connect_param.colour: unknown key",
        ),
        ({"collection_infos": []}, "collection_infos or db_collections: required"),
        (
            {"collection_infos": [{"name": "*"}, {"name": "a"}]},
            "'*' selects every collection and must stand alone",
        ),
        ({"collection_infos": [{"name": "a"}, {"name": "a"}]}, "a collection is named twice"),
        ({"collection_infos": [{"name": "1abc"}]}, "'1abc' is not a valid name"),
        ({"collection_infos": [{"name": "x" * 257}]}, "longer than 256 characters"),
        (
            {"collection_infos": [{"name": "a"}], "db_collections": {"d": [{"name": "a"}]}},
            "either collection_infos or db_collections",
        ),
        ({"db_collections": {"bad-db": [{"name": "a"}]}}, "'bad-db' is not a valid name"),
        ({"db_collections": {"d": []}}, "db_collections.d: empty"),
        (
            {
                "collection_infos": [{"name": "a"}],
                "name_mapping": [
                    {"source_db": "default", "target_db": "b", "collection_mapping": {"z": "y"}}
                ],
            },
            "default.z is not selected by the task",
        ),
        ({"rpc_channel_info": {"name": "bad/name"}}, "rpc_channel_info.name"),
        ({"kafka_connect_param": {"address": "k:9092"}}, "give one target"),
        ({"task_id": "has space"}, "task_id: must be"),
        ({"disable_auto_start": "yes"}, "disable_auto_start: Input should be a valid boolean"),
    ],
)
def test_invalid_create_requests_name_the_problem(data, message):
    with pytest.raises(BadRequestError) as error:
        validate(**data)
    assert message in error.value.message


def test_name_mapping_and_db_collections():
    spec = validate(
        db_collections={"sales": [{"name": "orders"}], "*": [{"name": "audit"}]},
        name_mapping=[
            {
                "source_db": "sales",
                "target_db": "sales_copy",
                "collection_mapping": {"orders": "orders_v2"},
            }
        ],
    )
    assert TaskSpec.from_stored(spec).selection == {("sales", "orders"), ("*", "audit")}
    assert spec["name_mapping"][0]["collection_mapping"] == {"orders": "orders_v2"}
    selection = TaskSelection.from_spec(TaskSpec.from_stored(spec))
    assert selection.selects("sales", "orders")
    assert selection.selects("anything", "audit")
    assert not selection.selects("sales", "items")
    assert selection.target_name("sales", "orders") == ("sales_copy", "orders_v2")
    assert selection.target_name("sales", "audit") == ("sales_copy", "audit")
    assert selection.target_name("", "audit") == ("default", "audit")


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ({("default", "*")}, {("default", "x")}, True),
        ({("default", "x")}, {("default", "y")}, False),
        ({("*", "x")}, {("sales", "x")}, True),
        ({("*", "x")}, {("sales", "y")}, False),
        ({("sales", "*")}, {("default", "*")}, False),
        ({("*", "*")}, {("anything", "at_all")}, True),
    ],
)
def test_selection_overlap(a, b, overlap):
    assert selections_overlap(a, b) is overlap
    assert selections_overlap(b, a) is overlap


def test_target_identity_ignores_spelling():
    assert target_identity({"host": "Milvus-B", "port": 19530}) == target_identity(
        {"uri": "http://milvus-b:19530"}
    )
    assert target_identity({"uri": "http://milvus-b"}) == ("milvus-b", 19530)
    assert target_identity({"uri": "https://milvus-b"}) == ("milvus-b", 443)


def test_public_view_has_no_secrets():
    spec = validate(milvus_connect_param={**TARGET, "username": "u", "password": "p4ss"})
    assert spec["milvus_connect_param"]["password"] == "p4ss"  # stored: needed to reconnect
    shown = TaskSpec.from_stored(spec).public_view()["milvus_connect_param"]
    assert "password" not in shown
    assert "token" not in shown
    assert shown["username"] == "u"


@pytest.mark.parametrize(
    ("source", "url"),
    [
        (
            "root:root@tcp(127.0.0.1:3306)/milvus-cdc?charset=utf8",
            "mysql+pymysql://root:root@127.0.0.1:3306/milvus-cdc?charset=utf8mb4",
        ),
        ("u:p%@w@tcp(db)/cdc", "mysql+pymysql://u:p%25%40w@db/cdc"),
        ("mysql://u:p@db:3306/cdc", "mysql+pymysql://u:p@db:3306/cdc"),
        ("mysql+pymysql://u:p@db/cdc", "mysql+pymysql://u:p@db/cdc"),
    ],
)
def test_mysql_source_url_forms(source, url):
    assert mysql_url_from_source(source) == url


def test_mysql_source_url_errors_do_not_echo_the_password():
    with pytest.raises(ValueError, match="expected user:password@tcp") as error:
        mysql_url_from_source("root:topsecret@db:3306")
    assert "topsecret" not in str(error.value)
    with pytest.raises(ValueError, match="unsupported scheme 'postgres'"):
        mysql_url_from_source("postgres://u:p@db/x")


KAFKA = {"address": "k1:9092,k2:9092", "topic": "milvus-events"}


def validate_kafka(**param):
    return validate(milvus_connect_param=None, kafka_connect_param={**KAFKA, **param})


def test_a_kafka_target_is_stored_in_place_of_a_milvus_and_shown_without_its_password():
    spec = validate_kafka(
        enable_sasl=True,
        sasl={"username": "cdc", "password": "s3cret", "mechanisms": "scram-sha-256"},
    )
    assert "milvus_connect_param" not in spec
    assert spec["kafka_connect_param"] == {
        "address": "k1:9092,k2:9092",
        "topic": "milvus-events",
        "enable_sasl": True,
        "connect_timeout": 10,
        "sasl": {
            "username": "cdc",
            "password": "s3cret",  # stored (sealed at rest): needed to reconnect
            "mechanism": "SCRAM-SHA-256",
            "security_protocol": "SASL_PLAINTEXT",
        },
    }
    shown = TaskSpec.from_stored(spec).public_view()["kafka_connect_param"]
    assert "s3cret" not in str(shown) and shown["sasl"]["username"] == "cdc"


def test_a_go_client_body_with_an_empty_kafka_param_beside_a_milvus_is_a_milvus_task():
    spec = validate(kafka_connect_param={"address": "", "topic": "", "enable_sasl": False})
    assert "kafka_connect_param" not in spec and spec["milvus_connect_param"]["port"] == 19530


@pytest.mark.parametrize(
    ("param", "extra", "message"),
    [
        ({"address": "no-port"}, {}, "kafka_connect_param.address"),
        ({"topic": "bad topic"}, {}, "kafka_connect_param.topic"),
        ({"topic": "cdc.{db}.{collection}"}, {}, "kafka_connect_param.ddl_topic: required"),
        ({"topic": "t", "ddl_topic": "d.{db}"}, {}, "kafka_connect_param.ddl_topic"),
        ({"enable_sasl": True, "sasl": {"username": "u"}}, {}, "needs a username and a password"),
        (
            {"enable_sasl": True, "sasl": {"username": "u", "password": "p", "mechanism": "X"}},
            {},
            "sasl.mechanism",
        ),
        ({}, {"backfill": {"collections": ["*"]}}, "backfill: a Kafka target takes no backfill"),
        ({}, {"extra_info": {"enable_user_role": True}}, "extra_info.enable_user_role"),
    ],
)
def test_invalid_kafka_targets_name_the_problem(param, extra, message):
    with pytest.raises(BadRequestError) as error:
        validate(milvus_connect_param=None, kafka_connect_param={**KAFKA, **param}, **extra)
    assert message in error.value.message


def test_a_kafka_topic_may_name_the_database_and_collection():
    spec = validate_kafka(topic="cdc.{db}.{collection}", ddl_topic="cdc.ddl")
    assert spec["kafka_connect_param"]["ddl_topic"] == "cdc.ddl"
