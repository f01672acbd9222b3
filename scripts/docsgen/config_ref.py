"""docs/reference/configuration.md from the settings model (replicator/config/settings.py
``CdcSettings`` and its sections): every key with its type, default and environment variable;
its meaning is the comment above the key (or beside it) in configs/cdc.yaml, the file that
documents every key (a key the file does not explain is shown with its section's comment)."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[2]

HEADER = """# Configuration

Every key of the daemon's configuration, read from its settings model
(`replicator/config/settings.py` and its sections) by `scripts/gen_docs.py`: do not edit by
hand. The meaning of each key is the comment above it in `configs/cdc.yaml`, which sets every
key to its default. Any key can be set from the environment: `CDC_` and the key path joined by
`__` (case-insensitive; lists and maps as YAML/JSON). An unknown key, a wrong type or a missing
required value stops the daemon at start with exit code 2 naming the key. How to write a
configuration: [Configure the daemon](../guides/configure.md).

`clusters.<name>` (disaster recovery's named clusters) takes every key of `sourceConfig`.
"""


def yaml_comments(text: str) -> dict[str, str]:
    """key path -> the comment block above the key (and its trailing comment)."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    group = ("", -1)  # a comment covers the keys after it, at its indent, until a blank line
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending, group = [], ("", -1)
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"([A-Za-z_][\w]*):(.*)$", stripped)
        if not match or stripped.startswith("- "):
            pending = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, rest = match.groups()
        path = ".".join([*(k for _, k in stack), key])
        trailing = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        comment = " ".join([*pending, trailing]).strip()
        if pending:
            group = (" ".join(pending), indent)
        inherited = group[0] if group[1] == indent else ""
        if comment or inherited:
            found[path] = comment or inherited
        stack.append((indent, key))
        pending = []
    return found


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, dict, tuple, set):
        return f"{origin.__name__} of " + ", ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "-"
    return f"default `{json.dumps(value, default=str)}`"


def _alike(path: str, comments: dict[str, str]) -> str:
    """The comment of a key spelled the same in another section (sourceConfig.etcd.password
    is explained under metaStoreConfig.etcd)."""
    tail = ".".join(path.split(".")[-2:])
    return next((text for key, text in comments.items() if key.endswith("." + tail)), "")


TABLE = "| key and environment variable | type, default | meaning |\n|---|---|---|"


def _section(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _rows(fields: dict[str, Any], prefix: str, comments: dict[str, str], out: list[str]) -> None:
    for name, field in fields.items():
        path = f"{prefix}{name}"
        nested = _section(field.annotation)
        if nested is not None:
            out.append(f"| **`{path}`** | section | {comments.get(path, '')} |")
            _rows(nested.model_fields, f"{path}.", comments, out)
            continue
        env = "CDC_" + path.replace(".", "__").upper()
        meaning = comments.get(path) or _alike(path, comments)
        if not meaning and prefix:  # explained with its section
            meaning = f"See its section, `{prefix.rstrip('.')}`."
        out.append(
            f"| `{path}`<br>`{env}` | {_type_name(field.annotation)}, {_default(field)} | "
            f"{meaning.replace('|', '/')} |"
        )


def render() -> str:
    """The top-level keys in one table, then a heading and a table per top-level section."""
    from replicator.config.settings import CdcSettings

    comments = yaml_comments((REPO / "configs" / "cdc.yaml").read_text())
    out = [HEADER, "## Top-level keys", "", TABLE]
    fields = CdcSettings.model_fields
    for name, field in fields.items():
        if _section(field.annotation) is None:
            _rows({name: field}, "", comments, out)
    for name, field in fields.items():
        nested = _section(field.annotation)
        if nested is not None:
            out.extend(["", f"## `{name}`", "", comments.get(name, ""), "", TABLE])
            _rows(nested.model_fields, f"{name}.", comments, out)
    return "\n".join(out) + "\n"
