"""docs/reference/http-api.md from the OpenAPI document the daemon serves at /openapi.json
(server/http/openapi.py ``openapi_document``): every route and method with its summary,
parameters, body and answers, then every schema with its properties."""

from __future__ import annotations

import json
from typing import Any

HEADER = """# HTTP API

Every route of the daemon, rendered from the OpenAPI {version} document it serves at
`GET /openapi.json` (`server/http/openapi*.py`) by `scripts/gen_docs.py`: do not edit by hand.
The Go milvus-cdc's `POST /cdc` requests, with examples: [`POST /cdc` requests](cdc-requests.md);
the REST resources in prose: [REST and OpenAPI](../operations/rest.md). With tokens configured,
every route but `/livez`, `/readyz`, `/openapi.json` and the dashboard's page wants
`Authorization: Bearer <token>` ([Secure the API](../security/api.md)).
"""

METHODS = ("get", "post", "put", "delete", "patch")


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "oneOf" in schema or "anyOf" in schema:
        return " or ".join(_type(s) for s in schema.get("oneOf") or schema["anyOf"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and "items" in schema:
        return f"array of {_type(schema['items'])}"
    if "enum" in schema:
        return f"{kind}: " + ", ".join(f"`{v}`" for v in schema["enum"])
    return str(kind)


def _cell(text: object) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _properties(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    if not props:
        return []
    required = set(schema.get("required") or ())
    rows = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for name, prop in props.items():
        meaning = prop.get("description", "")
        if "default" in prop:
            meaning += f" (default `{json.dumps(prop['default'])}`)"
        rows.append(
            f"| `{name}` | {_cell(_type(prop))} | {'yes' if name in required else ''} | "
            f"{_cell(meaning)} |"
        )
    return rows


def _operation(path: str, method: str, op: dict[str, Any], shared: list[Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`\n"]
    if op.get("summary"):
        out.append(op["summary"] + ".\n" if not op["summary"].endswith(".") else op["summary"])
    if op.get("description"):
        out.append(op["description"] + "\n")
    params = [*shared, *(op.get("parameters") or [])]
    if params:
        out.append("| parameter | in | meaning |\n|---|---|---|")
        out.extend(
            f"| `{p['name']}` | {p['in']} | {_cell(p.get('description', ''))} |" for p in params
        )
        out.append("")
    body = (op.get("requestBody") or {}).get("content") or {}
    for media, content in body.items():
        out.append(f"Body (`{media}`): {_type(content.get('schema', {}))}\n")
    out.append("| answer | meaning | body |\n|---|---|---|")
    for code, answer in sorted((op.get("responses") or {}).items()):
        content = answer.get("content") or {}
        kinds = ", ".join(f"{_type(c.get('schema', {}))} (`{m}`)" for m, c in content.items())
        out.append(f"| {code} | {_cell(answer.get('description', ''))} | {_cell(kinds) or '-'} |")
    out.append("")
    return out


def render() -> str:
    from server.http.openapi import openapi_document

    doc = openapi_document()
    out = [HEADER.format(version=doc["openapi"]), "## Routes\n"]
    for path, item in doc["paths"].items():
        shared = item.get("parameters") or []
        for method in METHODS:
            if method in item:
                out.extend(_operation(path, method, item[method], shared))
    out.append("## Schemas\n")
    for name, schema in doc["components"]["schemas"].items():
        out.append(f"### {name}\n")
        if schema.get("description"):
            out.append(_cell(schema["description"]) + "\n")
        rows = _properties(schema)
        if rows:
            out.append("\n".join(rows) + "\n")
        elif "type" in schema or "oneOf" in schema:
            out.append(f"Type: {_type(schema)}\n")
    return "\n".join(out).rstrip("\n") + "\n"
