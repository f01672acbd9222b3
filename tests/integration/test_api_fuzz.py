"""Property test: at least 10,000 generated request bodies against a running daemon.

Every answer must be the JSON envelope ``{"code", "message", "data"}`` with ``code`` equal to the
HTTP status and never a 500; a request that is not answered 200 must leave the store exactly as
it was (tasks, states, revisions, specs, positions).
"""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from harness.services import free_port
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metastore.sql_schema import positions_table, tasks_table

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("CDC_FUZZ_EXAMPLES", "10000"))
PER_EXAMPLE = 25
REQUEST_TYPES = ["create", "delete", "pause", "resume", "get", "list", "position"]
EXPECTED_CODES = {200, 400, 404, 405, 409, 413}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the plausible value, sometimes anything at all."""
    return st.one_of(strategy, strategy, strategy, json_values)


def create_data(lite_port: int, closed_port: int, task_ids: list[str]) -> st.SearchStrategy:
    names = st.sampled_from(["*", "orders", "users", "_x1", "1bad", "", "a-b", "a" * 300, "ü"])
    infos = st.lists(
        st.fixed_dictionaries(
            {"name": maybe(names)},
            optional={"positions": json_values, "use_start_position": maybe(st.booleans())},
        ),
        max_size=3,
    )
    connect = st.fixed_dictionaries(
        {},
        optional={
            # hosts and ports that answer at once: the real target, a closed port, or nothing
            "host": maybe(st.sampled_from(["127.0.0.1", "localhost", ""])),
            "port": maybe(st.sampled_from([lite_port, closed_port, 0, -1, 70000])),
            "uri": maybe(
                st.sampled_from(
                    [
                        "",
                        f"http://127.0.0.1:{lite_port}",
                        f"http://127.0.0.1:{closed_port}",
                        "http://127.0.0.1:notaport",
                        "ftp://127.0.0.1:1",
                        "http://",
                    ]
                )
            ),
            "username": maybe(st.sampled_from(["", "root"])),
            "password": maybe(st.sampled_from(["", "Milvus"])),
            "token": maybe(st.sampled_from(["", "root:Milvus"])),
            "enable_tls": maybe(st.booleans()),
            "connect_timeout": maybe(st.sampled_from([0, 1, 2, -1, 301])),
            "dial_config": maybe(
                st.fixed_dictionaries({}, optional={"server_pem_path": st.just("/nonexistent")})
            ),
            "channel_num": maybe(st.integers(-1, 4)),
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "milvus_connect_param": maybe(connect),
            "collection_infos": maybe(infos),
            "db_collections": maybe(st.dictionaries(names, infos, max_size=2)),
            "rpc_channel_info": maybe(
                st.fixed_dictionaries(
                    {"name": maybe(st.sampled_from(["by-dev-replicate-msg", "", "/"]))}
                )
            ),
            "name_mapping": maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {"source_db": maybe(names), "target_db": maybe(names)},
                        optional={"collection_mapping": st.dictionaries(names, names, max_size=2)},
                    ),
                    max_size=2,
                )
            ),
            "extra_info": maybe(st.fixed_dictionaries({"enable_user_role": maybe(st.booleans())})),
            "disable_auto_start": maybe(st.booleans()),
            "task_id": maybe(st.sampled_from(["", *task_ids, "fresh-id", "bad/id"])),
            "unexpected": json_values,
        },
    )


def bodies(lite_port: int, closed_port: int, task_ids: list[str]) -> st.SearchStrategy:
    id_data = st.fixed_dictionaries(
        {"task_id": maybe(st.sampled_from([*task_ids, "missing", ""]))},
        optional={"ignore_not_found": maybe(st.booleans()), "extra": json_values},
    )
    envelope = st.fixed_dictionaries(
        {
            "request_type": maybe(st.sampled_from([*REQUEST_TYPES, "", "CREATE", "drop"])),
        },
        optional={
            "request_data": st.one_of(
                create_data(lite_port, closed_port, task_ids), id_data, json_values
            ),
            "other": json_values,
        },
    )
    return st.one_of(
        envelope.map(lambda d: json.dumps(d).encode()),
        envelope.map(lambda d: json.dumps(d).encode()),
        envelope.map(lambda d: json.dumps(d).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
    )


def test_generated_bodies_get_wellformed_answers_and_leave_no_trace(
    daemon_factory, milvus_lite_service
):
    daemon = daemon_factory().start()
    seeded = daemon.call(
        "create",
        {
            "milvus_connect_param": {"host": "127.0.0.1", "port": milvus_lite_service.port},
            "collection_infos": [{"name": "seeded"}],
            "task_id": "seeded-task",
            "disable_auto_start": True,
        },
    )
    assert seeded.code == 200
    # the store's task and position rows as stored, every column (state, reason, revision,
    # spec, extra, times; each position), read with sqlite3 rather than through the store's
    # SQLAlchemy engine and records: a tenth of the cost, paid after every one of the requests
    store = sqlite3.connect(
        f"file:{daemon.config['metaStoreConfig']['sqlitePath']}?mode=ro", uri=True
    )

    def snapshot() -> list[tuple]:
        tasks = store.execute(f"SELECT * FROM {tasks_table.name} ORDER BY root_path, task_id")
        positions = store.execute(
            f"SELECT * FROM {positions_table.name} ORDER BY root_path, task_id, pchannel"
        )
        return [*tasks, *positions]

    seen = {"count": 0, "codes": {}, "before": snapshot()}
    methods = st.sampled_from(["POST"] * 30 + ["GET", "PUT", "PATCH"])
    requests = st.tuples(bodies(milvus_lite_service.port, free_port(), ["seeded-task"]), methods)

    def check_one(body: bytes, method: str) -> None:
        reply = daemon.send(body, method=method, timeout=30)
        seen["count"] += 1
        assert set(reply.body) == {"code", "message", "data"}, reply.raw
        assert isinstance(reply.body["code"], int)
        assert isinstance(reply.body["message"], str)
        assert isinstance(reply.body["data"], dict)
        assert reply.code == reply.status, reply.raw
        assert reply.code in EXPECTED_CODES, (body, reply.raw)
        seen["codes"][reply.code] = seen["codes"].get(reply.code, 0) + 1
        after = snapshot()
        if reply.code != 200:
            assert reply.message, reply.raw
            assert "Traceback" not in reply.message
            assert after == seen["before"], (body, reply.raw)
        seen["before"] = after

    # PER_EXAMPLE requests in each example: Hypothesis's own cost per example (its search
    # bookkeeping, about half of the test's time with one request each) is paid a 25th as often;
    # the bodies are still EXAMPLES draws, each sent and checked on its own
    @settings(
        max_examples=-(-EXAMPLES // PER_EXAMPLE),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=st.lists(requests, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def check(batch: list[tuple[bytes, str]]) -> None:
        for body, method in batch:
            check_one(body, method)

    try:
        check()
    finally:
        store.close()
    print(f"fuzz: {seen['count']} bodies, answers by code: {sorted(seen['codes'].items())}")
    assert seen["count"] >= EXAMPLES
    # the generator reached both the accepting and the rejecting paths
    assert seen["codes"].get(200, 0) > 0
    assert seen["codes"].get(400, 0) > EXAMPLES // 2
    assert "Traceback" not in daemon.log_text()
