"""Create-request bodies for tests: a task replicating into the session's Milvus Lite."""

from __future__ import annotations

from typing import Any


def lite_param(lite: Any, **extra: Any) -> dict[str, Any]:
    return {"host": lite.host, "port": lite.port, "connect_timeout": 5, **extra}


def create_body(lite: Any, collections: tuple[str, ...] = ("*",), **extra: Any) -> dict[str, Any]:
    return {
        "milvus_connect_param": lite_param(lite),
        "collection_infos": [{"name": n} for n in collections],
        "rpc_channel_info": {"name": "by-dev-replicate-msg"},
        **extra,
    }
