"""Every setting works or says it does not: the replicate channel follows the channel prefix,
readChanLen reaches the readers, the Go tool's create fields are honoured or refused by name,
and keys accepted only for drop-in compatibility are reported at start."""

from __future__ import annotations

import time

import pytest

from metastore import TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.settings import CdcSettings, unused_settings
from server.errors import BadRequestError
from server.tasks.engine import make_runner_factory
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.spec import validate_create

TARGET = {"host": "milvus-b", "port": 19530}


def settings_of(data: dict) -> CdcSettings:
    return CdcSettings(**data)


def spec_of(settings_overrides: dict, **request: object) -> dict:
    settings = settings_of(settings_overrides)
    request.setdefault("milvus_connect_param", TARGET)
    request.setdefault("collection_infos", [{"name": "*"}])
    return validate_create(parse_model(CreateRequest, request), settings).to_stored()


def test_the_replicate_channel_follows_the_channel_prefix_not_the_etcd_root():
    """Milvus names it <common.chanNamePrefix.cluster>-replicate-msg; the etcd root path is
    another setting (the default used it, so a source with its own prefix was missed)."""
    spec = spec_of({"sourceConfig": {"etcdRootPath": "meta-root", "channelPrefix": "cluster-a"}})
    assert spec["rpc_channel_info"]["name"] == "cluster-a-replicate-msg"
    spec = spec_of({"sourceConfig": {"etcdRootPath": "meta-root"}})
    assert spec["rpc_channel_info"]["name"] == "meta-root-replicate-msg"


def test_read_chan_len_sets_how_far_each_channel_reads_ahead(tmp_path):
    settings = settings_of(
        {"sourceConfig": {"readChanLen": 5, "kafka": {"address": "127.0.0.1:1"}}}
    )
    factory = make_runner_factory(settings)
    now = time.time()
    task = TaskRecord("t", TaskState.RUNNING, "", {"milvus_connect_param": TARGET}, now, now)

    async def failed(_task_id: str, _reason: str) -> None:
        return None

    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.sqlite3")), "test")
    runner = factory(task, store, failed)
    assert runner.context.read_ahead == 5  # type: ignore[attr-defined]
    store.close()


def test_read_chan_len_is_bounded():
    with pytest.raises(Exception, match="readChanLen"):
        settings_of({"sourceConfig": {"readChanLen": 1000}})


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"milvus_connect_param": {**TARGET, "channel_num": 4}}, "channel_num: not used"),
        ({"buffer_config": {"period": 100, "size": 0}}, "buffer_config: not used"),
        ({"buffer_config": {"period": 0, "size": 1024}}, "buffer_config: not used"),
    ],
)
def test_go_create_fields_without_a_meaning_here_are_refused_by_name(request_fields, message):
    with pytest.raises(BadRequestError, match=message):
        spec_of({}, **request_fields)


def test_go_create_fields_at_their_defaults_are_accepted():
    spec = spec_of(
        {},
        milvus_connect_param={**TARGET, "channel_num": 0, "ignore_partition": True},
        buffer_config={"period": 0, "size": 0},
        collection_infos=[{"name": "*", "use_start_position": True}],
    )
    assert spec["milvus_connect_param"]["ignore_partition"] is True


def test_keys_kept_only_for_go_files_are_reported_when_set():
    assert unused_settings(settings_of({})) == []
    settings = settings_of(
        {
            "sourceConfig": {"pulsar": {"webAddress": "pulsar-admin:8080"}},
            "metaStoreConfig": {"etcd": {"tlsMinVersion": "1.2"}},
        },
    )
    unused = unused_settings(settings)
    assert any(u.startswith("sourceConfig.pulsar.webAddress") for u in unused), unused
    assert any(u.startswith("metaStoreConfig.etcd.tlsMinVersion") for u in unused), unused
