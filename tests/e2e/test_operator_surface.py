"""The operator's surface on a task that really replicates: a Milvus 2.3.5 source on Kafka, a
Milvus Lite target. The task is created with the CLI, watched and paused/resumed from the
dashboard in headless Chromium, and inspected with the CLI; the target follows."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from harness.browser import chromium, read_png
from harness.daemon import REPO_ROOT
from harness.services import wait_until
from pymilvus import MilvusClient
from test_replication import create_source_collection, make_rows, rows, source_config

pytestmark = pytest.mark.e2e


def cli(*args: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    environ.update(PYTHONPATH=str(REPO_ROOT), no_proxy="127.0.0.1,localhost")
    done = subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def cell(task_id: str, name: str) -> str:
    return f"document.querySelector('#tasks tr[data-task-id=\"{task_id}\"] .{name}')?.textContent"


async def test_dashboard_and_cli_on_a_replicating_task(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_lite_service, tmp_path
):
    name = f"ops_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    try:
        create_source_collection(source, name)
        source.insert(name, make_rows(0, 100, "before"))
        config = source_config(milvus_source, etcd_service, kafka_mock)
        daemon = daemon_factory(**config, scheduler={"progressSampleSeconds": 0.5}).start()
        url = daemon.cli_args
        created = json.loads(
            cli("task", "create", *url, "--target", milvus_lite_service.uri,
                "--collection", name, "--task-id", "ops-1", "--json")
        )  # fmt: skip
        assert created["task"]["state"] == "Running"
        source.insert(name, make_rows(100, 300, "after"))

        def target_count() -> int:
            if not target.has_collection(name):
                return 0
            return len(rows(target, name, "id"))

        wait_until(lambda: target_count() == 400, 120, "rows on the target")

        async with chromium(tmp_path / "chromium") as browser:
            page = await browser.new_page(1280, 900)
            await page.open_dashboard(daemon.url, daemon.token)
            # rows applied, a lag and a rate, read off the page
            applied = await page.wait_for(
                f"(t => t && +t.replace(/,/g, '') >= 400 && t)({cell('ops-1', 'rows')})", 60
            )
            assert int(applied.replace(",", "")) >= 400
            lag = await page.wait_for(f"(t => t && t.endsWith(' s') && t)({cell('ops-1', 'lag')})")
            assert float(lag.removesuffix(" s")) < 60
            rate = await page.wait_for(f"(t => t && t !== '\u2014' && t)({cell('ops-1', 'rate')})")
            assert float(rate.replace(",", "")) >= 0

            # the detail: channels with rows and saved positions, the replicate channel among them
            await page.click('#tasks tr[data-task-id="ops-1"] code')
            channel_rows = await page.wait_for(
                "[...document.querySelectorAll('#detail-channels tbody tr')]"
                ".map(r => r.dataset.channel)",
            )
            assert any(ch.startswith(milvus_source.chan_prefix) for ch in channel_rows)
            positions = await page.wait_for(
                "(p => p.length && p)([...document.querySelectorAll("
                "'#detail-positions tbody tr')].map(r => r.dataset.channel))"
            )
            assert milvus_source.replicate_channel in positions
            # the last hour's charts: lag per channel and rows/s, drawn from the daemon's samples
            lag_points = await page.wait_for(
                "(n => n >= 2 && n)(Math.max(0, ...[...document.querySelectorAll("
                "'#chart-lag polyline')].map(l => l.getAttribute('points').split(' ').length)))",
                30,
            )
            assert lag_points >= 2
            assert await page.wait_for(
                "document.querySelectorAll('#chart-rate polyline').length > 0", 30
            )
            history = await page.evaluate(
                "fetch('/v1/tasks/ops-1/history', {headers: authHeaders()}).then(r => r.json())"
            )
            assert len(history["samples"]) >= 2 and history["interval_seconds"] == 0.5

            # pause from the page: writes wait; resume: they arrive
            await page.click('#tasks tr[data-task-id="ops-1"] button[data-action="pause"]')
            await page.wait_for(
                "document.querySelector('#tasks tr[data-task-id=\"ops-1\"]').dataset.state"
                " === 'Paused'"
            )
            source.insert(name, make_rows(1000, 50, "while paused"))
            await asyncio.sleep(3)
            assert target_count() == 400
            # paused: the detail says so, and the hour's lines stay on the charts
            assert await page.evaluate("document.querySelector('#detail-state').textContent") == (
                "Paused"
            )
            assert await page.evaluate("document.querySelectorAll('#chart-lag polyline').length")
            paused_shot = await page.screenshot(tmp_path / "paused.png")
            assert len(read_png(paused_shot).colours()) > 20
            await page.click('#tasks tr[data-task-id="ops-1"] button[data-action="resume"]')
            await page.wait_for(
                "document.querySelector('#tasks tr[data-task-id=\"ops-1\"]').dataset.state"
                " === 'Running'"
            )
            wait_until(lambda: target_count() == 450, 120, "the paused writes on the target")
            shot = await page.screenshot(tmp_path / "replicating.png")
            assert browser.exceptions == []
            if os.environ.get("CDC_SCREENSHOT_DIR"):  # docs/img/dashboard.png, made by this test
                (Path(os.environ["CDC_SCREENSHOT_DIR"]) / "dashboard.png").write_bytes(shot)
        png = read_png(shot)
        assert (png.width, png.height) == (1280, 900) and len(png.colours()) > 20

        # the CLI shows the same task: facts, the channel table and the positions table
        shown = cli("task", "get", "ops-1", *url)
        assert shown.splitlines()[1].split() == ["state", "Running"]
        assert "CHANNEL" in shown and "MSG_ID" in shown
        assert milvus_source.replicate_channel in shown
        listed = json.loads(cli("task", "list", *url, "--json"))["tasks"]
        assert listed[0]["progress"]["rows"] >= 50  # counted since the resume (a new runner)
    finally:
        source.close()
        target.close()
