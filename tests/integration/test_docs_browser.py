"""The documentation site as a reader sees it: ``milvus-cdc docs`` serves it on a loopback port,
and a headless Chromium renders the landing page, a guide and a generated reference, and finds a
page with the search box, offline (every request the pages make goes to the loopback server).
With ``CDC_SCREENSHOT_DIR`` set, the landing page and a search are saved there as PNG."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from harness.browser import chromium, read_png
from harness.installed import daemon_command
from harness.services import free_port, stop_process, wait_until

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 1280, 900


@pytest.fixture
def docs_url(tmp_path: Path):
    port = free_port()
    command, installed = daemon_command()
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    scratch = tmp_path / "tmp"  # where it builds the site it serves
    scratch.mkdir()
    log = tmp_path / "docs.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*command, "docs", "--port", str(port)],
            env={**environ, **installed, "TMPDIR": str(scratch)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url + "/index.html", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(serving, 120, "milvus-cdc docs serving", interval=0.3)
        assert f"documentation on {url}/" in log.read_text()
        yield url
    finally:
        stop_process(process)
    # stopped as a service manager stops it (SIGTERM): its copy of the site is gone
    assert process.returncode == 0, log.read_text()
    assert list(scratch.iterdir()) == []


def shots() -> Path | None:
    where = os.environ.get("CDC_SCREENSHOT_DIR")
    return Path(where) if where else None


async def test_the_site_renders_and_its_search_works_offline(docs_url, tmp_path):
    async with chromium(tmp_path / "chromium") as browser:
        page = await browser.new_page(WIDTH, HEIGHT)
        requests = browser.listen("Network.requestWillBeSent", page.session)
        await page.send("Network.enable")

        # the landing page: title, the two commands first, the status table, the nav
        await page.goto(docs_url + "/index.html")
        assert "milvus-cdc" in await page.evaluate("document.title")
        assert await page.evaluate("document.querySelector('article h1').textContent") == (
            "milvus-cdc¶"
        )
        first_code = await page.evaluate("document.querySelector('article pre').textContent")
        assert first_code.startswith("bash scripts/run.sh"), first_code
        assert await page.evaluate("document.querySelectorAll('article table tr').length") > 10
        nav = await page.evaluate(
            "[...document.querySelectorAll('.md-nav__link')].map(a => a.textContent.trim())"
        )
        assert {"Quickstart", "A DR drill", "Troubleshooting", "Configuration"} <= set(nav), nav
        landing = read_png(await page.screenshot(tmp_path / "landing.png"))
        assert (landing.width, landing.height) == (WIDTH, HEIGHT)
        assert len(landing.colours()) > 20  # text, code, the header: not a blank page
        if shots():
            (shots() / "docs-landing.png").write_bytes((tmp_path / "landing.png").read_bytes())

        # a guide: its step tables and highlighted commands
        await page.goto(docs_url + "/guides/dr-drill.html")
        title = await page.evaluate("document.querySelector('article h1').textContent")
        assert title.startswith("A DR drill"), title
        assert await page.evaluate("document.querySelectorAll('article .highlight').length") > 5
        steps = await page.evaluate(
            "[...document.querySelectorAll('article table td:first-child code')]"
            ".map(c => c.textContent)"
        )
        assert {"checking", "fencing", "reversing", "done"} <= set(steps), steps

        # a generated reference: a row per configuration key
        await page.goto(docs_url + "/reference/configuration.html")
        keys = await page.evaluate("document.querySelectorAll('article table tr').length")
        assert keys > 100, keys
        assert await page.evaluate(
            "[...document.querySelectorAll('article td code')]"
            ".some(c => c.textContent === 'CDC_FLEET__LEASESECONDS')"
        )

        # the search box: typed into like a person, answered from the local index
        await page.goto(docs_url + "/index.html")
        await page.click("input.md-search__input")
        await page.wait_for("document.activeElement?.classList.contains('md-search__input')")
        await page.send("Input.insertText", {"text": "unapplied_from"})
        found = await page.wait_for(
            "(() => { const items = [...document.querySelectorAll('.md-search-result__item a')];"
            " return items.length ? items.map(a => a.getAttribute('href')) : null; })()",
            within=30,
        )
        assert any("dr-drill" in href or "disaster-recovery" in href for href in found), found
        meta = await page.evaluate("document.querySelector('.md-search-result__meta').textContent")
        assert re.search(r"\d+ matching documents?", meta), meta
        await page.screenshot(tmp_path / "search.png")
        if shots():
            (shots() / "docs-search.png").write_bytes((tmp_path / "search.png").read_bytes())

        # offline: nothing was asked of any host but the loopback server
        urls = []
        while not requests.empty():
            urls.append(requests.get_nowait()["request"]["url"])
        assert urls and all(u.startswith((docs_url, "data:", "blob:")) for u in urls), [
            u for u in urls if not u.startswith(docs_url)
        ]
        assert browser.exceptions == []
