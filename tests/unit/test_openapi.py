"""/openapi.json is a public surface: pinned to tests/unit/snapshots/openapi.json, and it names
exactly the routes the application serves.

After an intended API change, regenerate the pin and review the diff:
    PYTHONPATH=. python3 -c 'import json, server.http.openapi as o;
    print(json.dumps(o.openapi_document(), indent=2, sort_keys=True))' \
    > tests/unit/snapshots/openapi.json
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from replicator.config.settings import load_settings
from server.app import create_app
from server.http.openapi import openapi_document

SNAPSHOT = Path(__file__).parent / "snapshots" / "openapi.json"


def test_document_equals_the_pinned_file():
    pinned = json.loads(SNAPSHOT.read_text())
    assert openapi_document() == pinned, (
        "the OpenAPI document changed; if intended, regenerate the pin (see module docstring)"
    )


def test_document_names_every_route_and_nothing_else():
    app = create_app(load_settings(None, {}))
    served = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method in ("HEAD", "*") or path.startswith("/dashboard"):
            continue  # HEAD twins of GET; static files of the dashboard
        served.add((route.method.lower(), path))
    served.add(("post", "/cdc"))  # registered for every method; only POST is answered
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert documented == served


def test_every_reference_resolves_and_operations_are_unique():
    document = openapi_document()
    text = json.dumps(document)
    schemas = document["components"]["schemas"]
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', text))
    assert refs and refs <= set(schemas)
    operations = [
        op["operationId"]
        for item in document["paths"].values()
        for key, op in item.items()
        if key != "parameters"
    ]
    assert len(operations) == len(set(operations))
    # the create body is the validating model's own schema: secrets are write-only
    connect = schemas["MilvusConnectParam"]["properties"]
    assert connect["password"]["writeOnly"] is True
    assert schemas["CreateRequest"]["additionalProperties"] is False
