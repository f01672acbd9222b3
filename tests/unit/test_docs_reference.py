"""The generated pages of the documentation (scripts/gen_docs.py): the references rendered from
the code (configuration from the settings model, the HTTP API from the OpenAPI document, the CLI
from its parser, the metrics from the registry, the target-version table) are what the code
renders now, and every message the code can produce has its entry in docs/troubleshooting.md,
under a kind whose cause and fix are written there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts import gen_docs  # noqa: E402
from scripts.docsgen import messages  # noqa: E402

TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"


def test_every_generated_page_is_what_the_code_renders_now() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("name", sorted(gen_docs.pages()))
def test_a_page_edited_by_hand_is_found_stale(name: str) -> None:
    """The check above can fail: a generated part changed by hand is rendered back."""
    current = (REPO / "docs" / name).read_text(encoding="utf-8")
    assert gen_docs.pages()[name](current) == current
    edited = current.replace("| ", "| edited by hand ", 1)
    assert edited != current
    assert gen_docs.pages()[name](edited) == current


def test_the_references_name_what_the_code_has() -> None:
    """A few facts of each reference, read here from the code, are in its page."""
    from replicator.config.settings import CdcSettings
    from server.cli.main import build_parser
    from server.http.openapi import openapi_document

    docs = REPO / "docs" / "reference"
    config = (docs / "configuration.md").read_text()
    for key in CdcSettings.model_fields:
        assert f"`{key}`" in config, key
    assert "`CDC_FLEET__LEASESECONDS`" in config
    assert "|  |" not in config  # every key has a meaning
    api = (docs / "http-api.md").read_text()
    for path, item in openapi_document()["paths"].items():
        for method in ("get", "post", "delete"):
            if method in item:
                assert f"`{method.upper()} {path}`" in api, (method, path)
    cli = (docs / "cli.md").read_text()
    assert "`milvus-cdc task switchover`" in cli and "`--max-lag S`" in cli
    assert build_parser().prog == "milvus-cdc"
    metrics = (docs / "metrics.md").read_text()
    assert "| `cdc_lag_seconds` | gauge | `task_id`, `channel` |" in metrics


def hand_written_kinds(page: str) -> dict[str, str]:
    """Kind -> its hand-written section (cause and fix), from the part before the catalogue."""
    head = page.split("## Every message", 1)[0]
    sections = re.split(r"^#### ", head, flags=re.MULTILINE)[1:]
    return {s.split("\n", 1)[0].strip(): s.split("\n", 1)[1] for s in sections}


def missing_entries(page: str, found: list[messages.Message]) -> list[str]:
    catalogue = page.split(messages.BEGIN, 1)[1]
    kinds = hand_written_kinds(page)
    missing = [f"{m.kind}: {m.template} ({m.where})" for m in found
               if f"`{messages._cell(m.template)}`" not in catalogue]  # fmt: skip
    missing += [f"kind {k}: no cause and fix" for k in {m.kind for m in found}
                if len(kinds.get(k, "").strip()) < 80]  # fmt: skip
    return missing


def test_every_message_the_code_produces_has_an_entry_with_cause_and_fix() -> None:
    found = messages.scan()
    assert len(found) > 300, len(found)  # the scan reads the code, not an empty list
    page = TROUBLESHOOTING.read_text(encoding="utf-8")
    assert missing_entries(page, found) == []


def test_a_new_message_or_kind_without_an_entry_is_named() -> None:
    page = TROUBLESHOOTING.read_text(encoding="utf-8")
    new = [
        messages.Message("ConflictError", "task {task_id}: a brand new refusal", "server/x.py"),
        messages.Message("BrandNewError", "something else", "server/y.py"),
    ]
    assert missing_entries(page, new) == [
        "ConflictError: task {task_id}: a brand new refusal (server/x.py)",
        "BrandNewError: something else (server/y.py)",
        "kind BrandNewError: no cause and fix",
    ]
