"""The OpenAPI 3.1 document served at ``/openapi.json``.

Its paths are in :mod:`server.http.openapi_paths`, its component schemas in
:mod:`server.http.openapi_schemas`; here they are put together with the security of each route.
tests/unit/test_openapi.py pins the document and checks that it names every route the
application serves, so a change to the API shows up as a change to the pinned file.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from aiohttp import web

from server.http.openapi_paths import path_items, problem_answer
from server.http.openapi_schemas import component_schemas

API_VERSION = "1.0.0"
_UNAUTHORIZED = problem_answer(
    "No valid token; the answer names the scheme (WWW-Authenticate: Bearer)"
)
# Without auth.tokens, or with auth.allowAnonymous, a request without a token is served.
_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {}]
_OPEN = ("/livez", "/readyz", "/openapi.json", "/")


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation but health, this document and the dashboard's page asks for a token
    (server/http/auth.py); the /v1 ones answer 401 as a problem."""
    for path, item in paths.items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            operation["security"] = [] if path in _OPEN else _SECURITY
            if path.startswith("/v1/"):
                operation["responses"]["401"] = _UNAUTHORIZED
    return paths


@functools.cache
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "milvus-cdc",
            "version": API_VERSION,
            "description": "Change-data-capture daemon for Milvus: replication tasks over REST "
            "(/v1) or the Go milvus-cdc protocol (POST /cdc).",
        },
        "paths": _secured(path_items()),
        "components": {
            "schemas": component_schemas(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An auth.tokens token: admin for changes, viewer for reads",
                }
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    return copy.deepcopy(_document())


async def openapi_endpoint(request: web.Request) -> web.Response:
    return web.json_response(_document())
