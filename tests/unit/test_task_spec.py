"""The task spec (replicator/config/task_spec.py): one typed, frozen value, stored as the same
JSON document the metastores held before it existed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from replicator.config.release import RELEASE
from replicator.config.settings import load_settings
from replicator.config.task_spec import TaskSpec
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.spec import validate_create

# a record as releases before the typed spec stored it (a Milvus target, two databases, a
# mapping, a backfill, and a key no release of ours reads)
STORED = {
    "milvus_connect_param": {
        "host": "milvus-b",
        "port": 19530,
        "username": "u",
        "password": "p4ss",
        "enable_tls": False,
        "dial_config": {},
        "ignore_partition": True,
        "connect_timeout": 7,
    },
    "source_cluster": "east",
    "target_cluster": "west",
    "rpc_channel_info": {"name": "by-dev-replicate-msg"},
    "extra_info": {"enable_user_role": True},
    "buffer_config": {"period": 0, "size": 0},
    "name_mapping": [
        {"source_db": "sales", "target_db": "sales2", "collection_mapping": {"o": "o2"}}
    ],
    "disable_auto_start": False,
    "start_at": "end",
    "db_collections": {"sales": [{"name": "o"}], "*": [{"name": "audit"}]},
    "verify": {"intervalHours": 6},
    "backfill": {"collections": ["sales.o"]},
    "a_later_release_key": {"kept": [1, 2]},
}


def test_a_stored_document_reads_typed_and_writes_back_unchanged():
    spec = TaskSpec.from_stored(STORED)
    assert spec.to_stored() == STORED
    assert json.dumps(spec.to_stored(), sort_keys=True) == json.dumps(STORED, sort_keys=True)
    assert spec.selection == {("sales", "o"), ("*", "audit")}
    assert (spec.source_cluster, spec.target_cluster, spec.source_name) == ("east", "west", "east")
    assert spec.rpc_channel == "by-dev-replicate-msg"
    assert spec.rbac and spec.start_at_end and not spec.disable_auto_start
    assert spec.backfill_collections == ("sales.o",)
    assert spec.verify == {"intervalHours": 6}
    assert spec.connect_timeout == 7.0
    assert not spec.is_kafka
    assert spec.target_key() == ("milvus", "milvus-b", "19530")
    assert spec.target_label() == "milvus-b:19530"
    assert spec.secrets() == ["p4ss"]


def test_the_spec_is_frozen_and_its_document_cannot_be_changed_through_it():
    spec = TaskSpec.from_stored(STORED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.source_cluster = "elsewhere"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.document["source_cluster"] = "elsewhere"  # type: ignore[index]
    param = spec.target_param
    param["port"] = 1
    assert spec.target_param["port"] == 19530  # a copy each time
    assert STORED["milvus_connect_param"]["port"] == 19530  # the input is not shared either


def test_a_document_of_an_early_release_without_optional_keys_reads():
    early = {"milvus_connect_param": {"uri": "https://z.example:443", "token": "t0ken"}}
    spec = TaskSpec.from_stored(early)
    assert spec.selection == frozenset()
    assert spec.source_cluster is None and spec.source_name == "sourceConfig"
    assert spec.rpc_channel == "" and spec.verify is None and spec.backfill_collections is None
    assert spec.connect_timeout == 10.0
    assert spec.target_key() == ("milvus", "z.example", "443")
    assert spec.public_view()["milvus_connect_param"] == {"uri": "https://z.example:443"}
    assert spec.to_stored() == early


def test_a_kafka_spec_hides_its_sasl_password_and_keys_on_the_first_broker():
    stored = {
        "kafka_connect_param": {
            "address": "K1:9092,k2:9092",
            "topic": "cdc",
            "sasl": {"username": "u", "password": "s3cret", "mechanisms": "PLAIN"},
        },
        "collection_infos": [{"name": "*"}],
    }
    spec = TaskSpec.from_stored(stored)
    assert spec.is_kafka and spec.selection == {("default", "*")}
    assert spec.target_key() == ("kafka", "k1:9092", "cdc")
    assert spec.target_label() == "kafka://K1:9092,k2:9092/cdc"
    assert spec.secrets() == ["s3cret"]
    assert "s3cret" not in json.dumps(spec.public_view())


def test_a_create_request_is_validated_once_into_the_spec_it_stores():
    settings = load_settings(None, {"CDC_SOURCECONFIG__MILVUS__URI": "http://source:19530"})
    request = parse_model(
        CreateRequest,
        {
            "milvus_connect_param": {"host": "milvus-b", "port": 19530},
            "collection_infos": [{"name": "orders"}],
            "backfill": {"collections": ["orders"]},
        },
    )
    spec = validate_create(request, settings)
    assert isinstance(spec, TaskSpec)
    assert spec.backfill_collections == ("orders",)
    # what the store keeps reads back as the same spec
    assert TaskSpec.from_stored(spec.to_stored()) == spec


def test_a_spec_this_release_cannot_read_is_refused_by_name_never_half_read():
    from replicator.config.task_spec import UnreadableSpecError

    with pytest.raises(UnreadableSpecError) as unreadable:
        TaskSpec.from_stored({**STORED, "db_collections": {"sales": [{"title": "o"}]}})
    assert "cannot be read by release" in str(unreadable.value)
    assert "KeyError: no 'name'" in str(unreadable.value)
    with pytest.raises(UnreadableSpecError):
        TaskSpec.from_stored({**STORED, "backfill": {"collections": 7}})


def test_a_task_of_a_newer_kind_is_named_and_left_alone():
    from replicator.config.task_spec import spec_problem, stored_secrets, without_secrets

    class Stored:
        def __init__(self, spec):
            self.spec = spec

    future = {
        "elasticsearch_connect_param": {"url": "https://es:9200", "password": "es-pw"},
        "collection_infos": [{"name": "c"}],
    }
    assert spec_problem(Stored(future)) == (
        f"its spec names no target release {RELEASE} knows (elasticsearch_connect_param): it "
        "writes to milvus_connect_param or kafka_connect_param"
    )
    assert spec_problem(Stored(STORED)) == ""
    damaged = {"collection_infos": [{"title": "c"}], "milvus_connect_param": {"token": "t0k"}}
    assert spec_problem(Stored(damaged)).startswith("its stored spec cannot be read")
    # the log redactor still learns its secrets; a view shows none
    assert stored_secrets(future) == ["es-pw"] and stored_secrets(damaged) == ["t0k"]
    assert "es-pw" not in json.dumps(without_secrets(future))
