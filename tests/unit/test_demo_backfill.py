"""The demo runs its backfill only where the Spark job can run, and says why not elsewhere
(server.demo.backfill_blocker; the whole demo is tests/e2e/test_demo.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from server.demo import walkthrough as demo


def test_without_java_the_backfill_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert "no Java runtime" in demo.backfill_blocker()


def test_a_java_home_is_enough_without_java_on_the_path(monkeypatch, tmp_path: Path):
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("pyspark is not installed here")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("#!/bin/sh\n")
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert demo.backfill_blocker() == ""


def test_without_pyspark_the_reason_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        demo.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "pyspark" else real(name, *args),
    )
    assert "'.[backfill]'" in demo.backfill_blocker()
