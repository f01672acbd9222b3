"""The dashboard at / in a headless Chromium against a running daemon with real tasks: the page
shows them, its buttons pause, resume and delete through the API, and it renders."""

from __future__ import annotations

import re
import time

import pytest
from harness.browser import chromium, read_png
from harness.task_bodies import create_body

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 1280, 800


def row(task_id: str, query: str = "") -> str:
    return f'#tasks tr[data-task-id="{task_id}"] {query}'.strip()


def state_of(task_id: str) -> str:
    return f"document.querySelector('{row(task_id)}')?.dataset.state"


def api_state(daemon, task_id):
    return daemon.request("GET", f"/v1/tasks/{task_id}")[2]["task"]["state"]


async def test_dashboard_shows_and_drives_real_tasks(
    daemon_factory, milvus_lite_service, kafka_mock, tmp_path
):
    daemon = daemon_factory().start()
    lite = milvus_lite_service
    kafka = {"address": kafka_mock.bootstrap, "topic": "dash-events"}
    to_kafka = {
        "kafka_connect_param": kafka,
        "collection_infos": [{"name": "audit"}],
        "task_id": "dash-k",
        "disable_auto_start": True,
    }
    for body in (
        create_body(lite, collections=("orders",), task_id="dash-a"),
        create_body(lite, collections=("users",), task_id="dash-b", disable_auto_start=True),
        to_kafka,
    ):
        assert daemon.request("POST", "/v1/tasks", body)[0] == 201

    async with chromium(tmp_path / "chromium") as browser:
        page = await browser.new_page(WIDTH, HEIGHT)
        await page.open_dashboard(daemon.url, daemon.token)
        assert await page.evaluate("document.title") == "milvus-cdc"
        await page.wait_for("document.querySelectorAll('#tasks tr.task').length === 3")
        assert await page.evaluate(state_of("dash-a")) == "Running"
        assert await page.evaluate(state_of("dash-b")) == "Initial"
        await page.wait_for("document.getElementById('daemon-status').dataset.status === 'ok'")
        buttons = await page.evaluate(
            f"[...document.querySelectorAll('{row('dash-a', 'button')}')]"
            ".map(b => [b.dataset.action, b.disabled])"
        )
        assert buttons == [["pause", False], ["resume", True], ["delete", False]]

        # pause and resume with mouse clicks; the daemon's state follows, and so does the page
        await page.click(row("dash-a", 'button[data-action="pause"]'))
        await page.wait_for(f"{state_of('dash-a')} === 'Paused'")
        assert api_state(daemon, "dash-a") == "Paused"
        assert (
            await page.evaluate(f"document.querySelector('{row('dash-a', '.error')}').textContent")
            == ""
        )
        await page.click(row("dash-a", 'button[data-action="resume"]'))
        await page.wait_for(f"{state_of('dash-a')} === 'Running'")
        assert api_state(daemon, "dash-a") == "Running"

        # a task's detail: target, collections, channels and positions tables
        await page.click(row("dash-a", "code"))
        await page.wait_for("document.getElementById('detail-id').textContent === 'dash-a'")
        detail = await page.evaluate(
            "({hidden: document.getElementById('detail').hidden,"
            " state: document.getElementById('detail-state').textContent,"
            " facts: document.getElementById('detail-facts').innerText,"
            " collections: [...document.querySelectorAll('#detail-collections li')]"
            ".map(li => li.textContent),"
            " tables: [...document.querySelectorAll('#detail table')].length})"
        )
        assert detail["hidden"] is False and detail["state"] == "Running"
        assert f"{lite.host}:{lite.port}" in detail["facts"]
        # up to when the target holds every source write, as the API says it: this source (an
        # empty one) has ticked no channel, so no figure is proven (issue 41, bug 9)
        facts = await page.wait_for(
            "document.getElementById('detail-facts').innerText.includes('Consistent up to')"
            " && document.getElementById('detail-facts').innerText"
        )
        up_to = (
            daemon.call("get", {"task_id": "dash-a"})
            .data["task"]["progress"]
            .get("consistent_up_to")
        )
        shown = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC" if up_to else r"not known yet"
        assert re.search(r"Consistent up to\s+" + shown, facts), (up_to, facts)
        assert detail["collections"] == ["default.orders"]
        assert detail["tables"] == 3
        # the state history, newest first: the pause and resume clicked above, with the reason
        changes = await page.wait_for(
            "document.querySelectorAll('#detail-states tbody tr').length >= 4 &&"
            " [...document.querySelectorAll('#detail-states tbody tr')]"
            ".map(tr => [...tr.children].slice(1, 3).map(td => td.textContent))"
        )
        assert changes[:2] == [
            ["Paused -> Running", "—"],
            ["Running -> Paused", "manually paused through the http interface"],
        ]

        # delete asks for a second click, then the row goes
        await page.click(row("dash-b", 'button[data-action="delete"]'))
        await page.wait_for(
            f"document.querySelector('{row('dash-b', 'button.confirm')}')?.textContent"
            " === 'Confirm delete'"
        )
        assert daemon.request("GET", "/v1/tasks/dash-b")[0] == 200  # not yet
        await page.click(row("dash-b", 'button[data-action="delete"]'))
        await page.wait_for(f"!document.querySelector('{row('dash-b')}')")
        assert daemon.request("GET", "/v1/tasks/dash-b")[0] == 404

        # a refused action is shown, not swallowed
        daemon.request("POST", "/v1/tasks/dash-a/pause")
        refreshes = int(await page.evaluate("document.body.dataset.refreshes"))
        await page.wait_for(f"+document.body.dataset.refreshes > {refreshes}")
        await page.evaluate(
            "document.querySelector('" + row("dash-a", 'button[data-action="pause"]') + "')"
            ".disabled = false"
        )
        await page.click(row("dash-a", 'button[data-action="pause"]'))
        message = await page.wait_for(
            "!document.getElementById('message').hidden"
            " && document.getElementById('message').textContent"
        )
        assert "already Paused" in message

        # a Kafka task's detail names its topic
        await page.click(row("dash-k", "code"))
        await page.wait_for("document.getElementById('detail-id').textContent === 'dash-k'")
        facts = await page.evaluate("document.getElementById('detail-facts').innerText")
        assert f"kafka://{kafka_mock.bootstrap}/dash-events" in facts

        shot = await page.screenshot(tmp_path / "dashboard.png")
        assert browser.exceptions == []

    png = read_png(shot)
    assert (png.width, png.height) == (WIDTH, HEIGHT)
    assert len(png.colours()) > 20  # text, badges, table lines: not a blank page
    assert (tmp_path / "dashboard.png").stat().st_size == len(shot)


async def test_dashboard_shows_the_reason_of_a_failed_task(
    daemon_factory, milvus_lite_service, tmp_path
):
    """A task stored as Failed (as the supervisor leaves it) shows its reason as the last error."""
    from metastore import TaskState
    from metastore.sql import SqlMetaStore
    from metastore.sql_urls import sqlite_url

    daemon = daemon_factory(scheduler={"retry": {"enabled": False}}).start()
    body = create_body(milvus_lite_service, task_id="dash-f", disable_auto_start=True)
    assert daemon.request("POST", "/v1/tasks", body)[0] == 201
    daemon.stop()
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    task = store.get_task("dash-f")
    reason = "channel by-dev-rootcoord-dml_0 at offset 7: undecodable record"
    store.update_task(
        "dash-f", state=TaskState.FAILED, reason=reason, expected_revision=task.revision
    )
    store.close()
    daemon.start()
    started = time.monotonic()
    async with chromium(tmp_path / "chromium") as browser:
        page = await browser.new_page(WIDTH, HEIGHT)
        await page.open_dashboard(daemon.url, daemon.token)
        await page.wait_for(f"{state_of('dash-f')} === 'Failed'")
        error = await page.evaluate(
            f"document.querySelector('{row('dash-f', '.error')}').textContent"
        )
        assert error == reason
        assert browser.exceptions == []
    assert time.monotonic() - started < 60
