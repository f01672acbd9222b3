"""The backfill option of create and the backfill request: checked against the task's selection
and the daemon's configuration (no I/O)."""

from __future__ import annotations

import pytest

from replicator.config.settings import load_settings
from server.errors import BadRequestError
from server.tasks.requests import BackfillRequest, CreateRequest, parse_model
from server.tasks.spec import validate_create

WITH_SOURCE = load_settings(None, {"CDC_SOURCECONFIG__MILVUS__URI": "http://source:19530"})
WITHOUT_SOURCE = load_settings(None, {})
TARGET = {"host": "milvus-b", "port": 19530}


def validate(settings=WITH_SOURCE, **data):
    data.setdefault("milvus_connect_param", TARGET)
    if "db_collections" not in data:
        data.setdefault("collection_infos", [{"name": "orders"}, {"name": "users"}])
    return validate_create(parse_model(CreateRequest, data), settings).to_stored()


def refused(settings=WITH_SOURCE, **data) -> str:
    with pytest.raises(BadRequestError) as caught:
        validate(settings, **data)
    return str(caught.value)


def test_no_backfill_by_default_the_go_tools_behaviour():
    assert "backfill" not in validate()
    assert "backfill" not in validate(backfill=None)


def test_all_or_named_selected_collections():
    assert validate(backfill={})["backfill"] == {"collections": ["*"]}
    assert validate(backfill={"collections": ["orders"]})["backfill"] == {"collections": ["orders"]}
    spec = validate(
        db_collections={"sales": [{"name": "*"}]}, backfill={"collections": ["sales.q1"]}
    )
    assert spec["backfill"] == {"collections": ["sales.q1"]}


def test_refusals_name_the_field():
    assert "backfill.collections[0]: 'orders2' is not selected" in refused(
        backfill={"collections": ["orders2"]}
    )
    assert "give it alone" in refused(backfill={"collections": ["*", "orders"]})
    assert "named twice" in refused(backfill={"collections": ["orders", "orders"]})
    assert "empty" in refused(backfill={"collections": []})
    assert "not a valid name" in refused(backfill={"collections": ["9x"]})
    assert "unknown key" in refused(backfill={"collection": ["orders"]})
    assert "sourceConfig.milvus.uri" in refused(WITHOUT_SOURCE, backfill={})


def test_backfill_request_defaults_to_every_collection():
    request = parse_model(BackfillRequest, {"task_id": "t1"})
    assert request.collections == ["*"]
    with pytest.raises(BadRequestError):
        parse_model(BackfillRequest, {"collections": ["a"]})  # no task_id
